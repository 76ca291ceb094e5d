"""train.monitor.Monitor on anyone's loop: the g/w/u and grad norm of the optimizer's real step
against the same numbers taken by hand, which steps make records, the eval internals against the
probes run on the same weights loaded through models.store, bad input refused in one line, and
the Hugging Face Trainer callback."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from nanogpt_ref import GPT, GPTConfig, save_like_nanogpt

from models.checkpoint import load_checkpoint, read_metrics
from probes.update_parts.report import parameter_group
from probes.updates import rms
from train.monitor import Monitor

CONFIG = GPTConfig(block_size=16, vocab_size=65, n_layer=2, n_head=4, n_embd=32)


def nanogpt(seed: int = 0, dtype: torch.dtype = torch.float32, config: GPTConfig = CONFIG) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).to(dtype)


def hf_gpt2(seed: int = 0, dtype: torch.dtype = torch.float32, config: GPTConfig = CONFIG):
    """A GPT2LMHeadModel of the nanoGPT config's sizes, with GPT-2's own init (no dropout)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    hf_config = transformers.GPT2Config(vocab_size=config.vocab_size, n_positions=config.block_size,
                                        n_embd=config.n_embd, n_layer=config.n_layer, n_head=config.n_head,
                                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(hf_config).to(dtype)


def logits_of(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)  # nanoGPT's GPT: logits; GPT2LMHeadModel: an output with .logits
    return getattr(out, "logits", out)  # [batch pos vocab]


def backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> float:
    """One batch's gradients (fresh ones); returns the loss."""
    tokens = torch.randint(0, CONFIG.vocab_size, (4, CONFIG.block_size + 1),
                           generator=torch.Generator().manual_seed(seed))  # [batch pos+1]
    logits = logits_of(model, tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss.item()


def open_monitor(model, optimizer, out_dir, **options) -> Monitor:
    return Monitor(model, optimizer, out_dir, report=False, **options)


def monitored_sgd(out, steps: int, logged_loss=lambda step, loss: loss, **options) -> dict[int, dict]:
    """`steps` SGD steps of the small nanoGPT, each logged as train_loss=logged_loss(step, loss);
    the records written, by step."""
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with open_monitor(model, optimizer, out, **options) as monitor:
        for step in range(steps):
            loss = backward(model, optimizer, seed=step)
            optimizer.step()
            monitor.log(step, train_loss=logged_loss(step, loss))
    return {r["step"]: r for r in read_metrics(out)}


def split_qkv(tensors: dict[str, torch.Tensor], weight_axis: int) -> dict[str, torch.Tensor]:
    """c_attn's packed q|k|v as three named rows, worked out here from GPT-2's layout: nn.Linear
    keeps them along dim 0 of its weight [3d d], Conv1D along dim 1 of [d 3d]; biases [3d]."""
    out = {}
    for name, t in tensors.items():
        if ".c_attn." not in name:
            out[name] = t
            continue
        axis = weight_axis if name.endswith("weight") else 0
        for part, third in zip("qkv", t.chunk(3, dim=axis)):
            out[name.replace(".c_attn.", f".c_attn.{part}.")] = third
    return out


# ------------------------------------------------------------------ g/w/u and the grad norm

@pytest.mark.parametrize("kind, weight_axis", [("nanogpt", 0), ("hf_gpt2", 1)])
def test_sgd_step_gwu_and_grad_norm_equal_the_hand_computed_ones(tmp_path, kind, weight_axis):
    model = (nanogpt if kind == "nanogpt" else hf_gpt2)(dtype=torch.float64)  # float64: exact to ~1e-15
    lr = 0.1
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    with open_monitor(model, optimizer, tmp_path / "run", log_every=3, eval_every=0) as monitor:
        for step in range(4):
            loss = backward(model, optimizer, seed=step)
            if step == 3:
                grads = {n: p.grad.clone() for n, p in model.named_parameters()}
                before = {n: p.detach().clone() for n, p in model.named_parameters()}
                total = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
                clipped_total = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)  # does not clip
            optimizer.step()
            monitor.log(step, train_loss=loss)
    after = {n: p.detach() for n, p in model.named_parameters()}
    record = next(r for r in read_metrics(tmp_path / "run") if r["step"] == 3)
    assert record["grad_norm"] == pytest.approx(float(total), rel=1e-12)
    assert record["grad_norm"] == pytest.approx(float(clipped_total), rel=1e-12)
    grads, before, after = (split_qkv(t, weight_axis) for t in (grads, before, after))
    assert list(record["gwu"]) == list(after)  # every parameter, q/k/v rows apart, module order
    for name, row in record["gwu"].items():
        w = rms(after[name])
        assert row["g"] == pytest.approx(rms(grads[name]), rel=1e-12), name
        assert row["w"] == pytest.approx(w, rel=1e-12), name
        assert row["u"] == pytest.approx(rms(after[name] - before[name]) / w, rel=1e-12), name
        assert row["u"] == pytest.approx(lr * row["g"] / w, rel=1e-9), name  # plain SGD: u is lr g / w
    groups = {part: parameter_group(f"transformer.h.0.attn.c_attn.{part}.weight") for part in "qkv"}
    assert groups == {"q": "attention Q/K", "k": "attention Q/K", "v": "attention V/O"}
    assert {f"transformer.h.1.attn.c_attn.{p}.{t}" for p in "qkv" for t in ("weight", "bias")} <= set(record["gwu"])


def test_a_given_grad_norm_wins_over_the_measured_one(tmp_path):
    """A loop that clips logs clip_grad_norm_'s pre-clip norm; the optimizer saw the clipped one."""
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with open_monitor(model, optimizer, tmp_path / "run", log_every=1, eval_every=0) as monitor:
        backward(model, optimizer, seed=0)
        pre_clip = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01))
        optimizer.step()
        monitor.log(0)
        backward(model, optimizer, seed=1)
        pre_clip_1 = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01))
        optimizer.step()
        monitor.log(1, grad_norm=pre_clip_1)
    measured, given = read_metrics(tmp_path / "run")
    assert pre_clip > 0.1 and measured["grad_norm"] == pytest.approx(0.01, rel=1e-5)  # after clipping
    assert given["grad_norm"] == pre_clip_1


# ------------------------------------------------------------------ which steps make records

def test_records_at_log_and_eval_steps_and_val_loss_calls_only(tmp_path):
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    used_lr = {}
    with open_monitor(model, optimizer, tmp_path / "run", log_every=4, eval_every=6) as monitor:
        for step in range(13):
            if step == 8:  # nanoGPT's order: the eval of step 8 is logged before its update
                monitor.log(step, val_loss=3.5)
            loss = backward(model, optimizer, seed=step)
            used_lr[step] = optimizer.param_groups[0]["lr"]
            optimizer.step()
            schedule.step()
            monitor.log(step, train_loss=loss)
            if step == 9:
                monitor.log(step, val_loss=3.25)  # an eval between log steps still counts
            if step == 12:
                monitor.log(step, lr=0.5)  # a given lr wins
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 4, 6, 8, 9, 12]
    by_step = {r["step"]: r for r in records}
    assert by_step[8]["val_loss"] == 3.5 and "train_loss" in by_step[8]  # two calls, one record
    assert by_step[9]["val_loss"] == 3.25 and "gwu" not in by_step[9]  # not a log step: no g/w/u
    assert all("gwu" in by_step[s] and "train_loss" in by_step[s] for s in (0, 4, 6, 8, 12))
    for step in (0, 4, 6, 8):  # read from the optimizer: the rate its update of that step used
        assert by_step[step]["lr"] == pytest.approx(used_lr[step], rel=1e-12)
    assert by_step[12]["lr"] == 0.5


def test_a_nan_loss_between_log_steps_marks_the_next_record_diverged(tmp_path):
    blow_up = lambda step, loss: loss if step < 5 else math.nan  # noqa: E731  (the run blows up at step 5)
    records = monitored_sgd(tmp_path / "run", 9, blow_up, log_every=4, eval_every=0)
    assert sorted(records) == [0, 4, 8]
    assert "diverged" not in records[4]
    assert records[8]["train_loss"] is None  # NaN is written as null
    assert records[8]["diverged"]["first_nonfinite_loss_step"] == 5
    assert "train loss" in records[8]["diverged"]["reason"]


def test_numpy_and_tensor_scalars_are_logged_as_numbers(tmp_path):
    np = pytest.importorskip("numpy")
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with open_monitor(model, optimizer, tmp_path / "run", log_every=1) as monitor:
        monitor.log(0, train_loss=np.float32(2.5), tokens=np.int64(4096), val_loss=torch.tensor(3.0))
    (record,) = read_metrics(tmp_path / "run")
    assert (record["train_loss"], record["tokens"], record["val_loss"]) == (2.5, 4096, 3.0)
    assert isinstance(record["tokens"], int)


# ------------------------------------------------------------------ eval internals

@pytest.mark.parametrize("training", [True, False])
def test_eval_internals_equal_the_probes_on_the_stored_weights(tmp_path, training):
    from probes import entropy
    from train.data import forward_stats

    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    eval_tokens = torch.randint(0, CONFIG.vocab_size, (3, CONFIG.block_size),
                                generator=torch.Generator().manual_seed(7))  # [batch pos]
    with open_monitor(model, optimizer, tmp_path / "run", log_every=1, eval_every=2,
                      eval_tokens=eval_tokens) as monitor:
        for step in range(3):
            loss = backward(model, optimizer, seed=step)
            optimizer.step()
            if step == 2:
                save_like_nanogpt(model, tmp_path / "ckpt.pt")  # the weights the eval will see
                state = {k: v.clone() for k, v in model.state_dict().items()}
                model.train(training)
            monitor.log(step, train_loss=loss)
            if step == 2:
                assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
                assert all(m.training == training for m in model.modules())
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert "attn_entropy" in records[0] and "attn_entropy" not in records[1]
    stored = load_checkpoint(tmp_path / "ckpt.pt").model
    want = entropy.run(stored, eval_tokens).entropy  # [layer][head]
    got = records[2]["attn_entropy"]
    assert [got[str(layer)] for layer in range(CONFIG.n_layer)] == [pytest.approx(row, rel=1e-5) for row in want]
    with torch.no_grad():
        stats = forward_stats(stored.eval(), eval_tokens)
    assert records[2]["logit_max"] == pytest.approx(stats["logit_max"], rel=1e-5)
    for key in ("attn_logit_max", "resid_rms"):
        assert records[2][key] == {layer: pytest.approx(v, rel=1e-5) for layer, v in stats[key].items()}
    assert set(records[2]["activations"]) == {f"blocks.{l}.mlp.hook_post" for l in range(CONFIG.n_layer)}


def test_without_eval_tokens_no_internals_are_written(tmp_path):
    records = list(monitored_sgd(tmp_path / "run", 2, log_every=1, eval_every=1).values())
    internals = {"attn_entropy", "attn_logit_max", "resid_rms", "logit_max", "activations"}
    assert len(records) == 2 and all("gwu" in r and not internals & set(r) for r in records)


# ------------------------------------------------------------------ bad input

def one_line_error(fn, *words: str) -> str:
    with pytest.raises(ValueError) as err:
        fn()
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


@pytest.mark.parametrize("tokens, words", [
    (torch.zeros(2, 8), ("eval_tokens", "integer", "float")),
    (torch.zeros(8, dtype=torch.long), ("eval_tokens", "[8]")),
    (torch.zeros(1, 2, 8, dtype=torch.long), ("eval_tokens", "[1, 2, 8]")),
    (torch.zeros(2, CONFIG.block_size + 1, dtype=torch.long), ("17 positions", "context of 16")),
    (torch.full((2, 8), CONFIG.vocab_size), ("eval_tokens", "outside [0, 65)", "max 65")),
    (torch.full((2, 8), -1), ("eval_tokens", "outside [0, 65)", "min -1")),
])
def test_bad_eval_tokens_are_refused_in_one_line(tmp_path, tokens, words):
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    one_line_error(lambda: open_monitor(model, optimizer, tmp_path / "run", eval_tokens=tokens), *words)


def tree(path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(path)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_an_old_run_or_a_locked_directory_is_refused(tmp_path):
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "run"
    with open_monitor(model, optimizer, out, log_every=1) as monitor:
        backward(model, optimizer, seed=0)
        optimizer.step()
        monitor.log(0, train_loss=4.0)
    on_disk = tree(out)
    one_line_error(lambda: open_monitor(model, optimizer, out), "already holds a run", "resume=True")
    assert tree(out) == on_disk  # nothing written, no lock file left behind

    busy = tmp_path / "busy"
    with open_monitor(model, optimizer, busy, log_every=1) as first:
        one_line_error(lambda: open_monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), busy,
                                            resume=True), "being trained by another process",
                       "choose another directory")  # the Monitor's words, not the CLI's --out
        backward(model, optimizer, seed=1)
        optimizer.step()
        first.log(0, train_loss=4.0)
    assert [r["step"] for r in read_metrics(busy)] == [0]


def test_bad_steps_scalars_and_intervals_are_refused_in_one_line(tmp_path):
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    one_line_error(lambda: open_monitor(model, optimizer, tmp_path / "zero", log_every=0), "log_every", "0")
    with open_monitor(model, optimizer, tmp_path / "run", log_every=1) as monitor:
        monitor.log(5, train_loss=4.0)
        one_line_error(lambda: monitor.log(3, train_loss=4.0), "step 3 after step 5", "must not go back")
        one_line_error(lambda: monitor.log(6, train_loss="4.0"), "train_loss", "must be a number", "str")
        one_line_error(lambda: monitor.log(6, train_loss=torch.ones(2)), "train_loss", "one number", "[2]")
        one_line_error(lambda: monitor.log(-1), "non-negative integer")
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [5]


# ------------------------------------------------------------------ the Trainer callback

def test_hf_callback_in_a_trainer_records_its_logs_updates_and_internals(tmp_path):
    transformers = pytest.importorskip("transformers")
    from probes import diagnose
    from train.monitor import HFCallback

    class HandUpdates(transformers.TrainerCallback):
        """u of block 0's Q columns (Conv1D [d 3d]) around each optimizer step, by the Trainer's
        step number after it (global_step + 1)."""

        def __init__(self):
            self.u: dict[int, float] = {}

        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            self.before = model.transformer.h[0].attn.c_attn.weight[:, :CONFIG.n_embd].detach().clone()

        def on_optimizer_step(self, args, state, control, model=None, **kwargs):
            after = model.transformer.h[0].attn.c_attn.weight[:, :CONFIG.n_embd].detach()
            self.u[state.global_step + 1] = rms(after - self.before) / rms(after)

    model = hf_gpt2()
    rows = torch.randint(0, CONFIG.vocab_size, (40, CONFIG.block_size), generator=torch.Generator().manual_seed(0))
    examples = [{"input_ids": r, "labels": r} for r in rows]  # [pos] each; the model shifts labels
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), use_cpu=True, report_to=[], max_steps=8, logging_steps=2,
        eval_strategy="steps", eval_steps=4, per_device_train_batch_size=4, per_device_eval_batch_size=8,
        learning_rate=1e-3, save_strategy="no", disable_tqdm=True, seed=0)
    hand = HandUpdates()
    callback = HFCallback(tmp_path / "run", log_every=2, eval_every=4, eval_tokens=rows[:2], report=False)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=examples[8:], eval_dataset=examples[:8],
                                   callbacks=[callback, hand])
    trainer.train()
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert sorted(records) == [2, 4, 6, 8]
    for logged in trainer.state.log_history:
        record = records[logged["step"]]
        if "loss" in logged:
            assert (record["train_loss"], record["grad_norm"], record["lr"]) == \
                (logged["loss"], logged["grad_norm"], logged["learning_rate"])
        if "eval_loss" in logged:
            assert record["val_loss"] == logged["eval_loss"]
    assert [s for s, r in records.items() if "val_loss" in r] == [4, 8]
    for step, record in records.items():
        assert record["gwu"]["transformer.h.0.attn.c_attn.q.weight"]["u"] == pytest.approx(hand.u[step], rel=1e-5)
        assert ("attn_entropy" in record) == (step % 4 == 0)
    result = diagnose.run(tmp_path / "run")
    assert (result.first_step, result.last_step) == (2, 8)
    assert not {"attn_logit_growth", "update_ratio_high", "grad_spike"} & set(result.not_checked)


@pytest.mark.parametrize("report", [False, True])
def test_a_context_manager_reports_at_its_end_only_where_report_says(tmp_path, monkeypatch, report):
    from train.doctor import LiveDoctor
    reports = []
    monkeypatch.setattr(LiveDoctor, "report", lambda self: reports.append(self) or None)
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, optimizer, tmp_path / "run", report=report) as monitor:
        backward(model, optimizer, seed=0)
        optimizer.step()
        monitor.log(0, train_loss=1.0)
    assert len(reports) == int(report)  # report=False used to print the report all the same


def test_the_last_step_is_recorded_at_close_with_its_own_step_time(tmp_path, monkeypatch):
    """steps 0..24 logged every 10: the run ended at 24, so its records end there (a run read as still
    going on kept the findings that need an ended run as warnings), and each record's step time is
    the loop's own: on a clock that moves 20 ms a step, 20 ms, the record written at close too (it was
    the ~1 ms between the last log call and the close)."""
    import train.monitor.recording as recording

    clock = {"now": 0.0}
    monkeypatch.setattr(recording.time, "perf_counter", lambda: clock["now"])
    model = nanogpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    with open_monitor(model, optimizer, tmp_path / "run", log_every=10, eval_every=0) as monitor:
        for step in range(25):
            loss = backward(model, optimizer, step)
            losses.append(loss)
            optimizer.step()
            clock["now"] = 0.02 * step
            monitor.log(step, train_loss=loss)
        clock["now"] += 5.0  # the loop's own teardown before the close: no step's time
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 10, 20, 24]
    assert records[-1]["train_loss"] == losses[24]  # the loop's own number, written once
    assert [r.get("step_time_ms") for r in records[1:]] == [pytest.approx(20.0)] * 3
