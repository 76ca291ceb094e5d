"""Issue 37, the Monitor in the loops its users write: nanoGPT's (eval before the step, val_loss
None between evals), a tutorial model read through the tap, and a Hugging Face Trainer with the
callback under gradient accumulation, with logging_steps above eval_steps, and on a LoRA-like
wrapper that trains a few added weights. Each record must sit at the optimizer step it measures
and be readable by every reader."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gpt_kit import CTX, VOCAB, BatchedGPT, tokens
from nanogpt_ref import GPT, GPTConfig

from models.checkpoint import read_metrics
from models.store.run import read_metrics_log
from probes.updates import rms
from train.monitor import Monitor

CONFIG = GPTConfig(block_size=16, vocab_size=65, n_layer=2, n_head=4, n_embd=32)


def refused(fn, kind, *words: str) -> str:
    with pytest.raises(kind) as err:
        fn()
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


# ------------------------------------------------------------------ nanoGPT's loop, in our words

def test_nanogpt_loop_with_val_none_between_evals(tmp_path):
    """iter 0 evaluates before its step, logs every log_interval after it, val_loss None elsewhere."""
    from probes.doctor.diagnosis import run as diagnose
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, 65, (64, 17), generator=torch.Generator().manual_seed(1))  # [rows pos+1]
    eval_interval, log_interval, max_iters = 4, 1, 13
    with Monitor(model, optimizer, tmp_path / "run", report=False, log_every=log_interval,
                 eval_every=eval_interval, eval_tokens=data[:2, :-1], steps=max_iters - 1) as monitor:
        for iter_num in range(max_iters):
            val = None
            if iter_num % eval_interval == 0:
                with torch.no_grad():
                    val = F.cross_entropy(model(data[:4, :-1]).flatten(0, 1), data[:4, 1:].flatten()).item()
            monitor.log(iter_num, val_loss=val)  # before the step, as nanoGPT's eval is
            batch = data[4 * iter_num % 60:][:4]
            loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            monitor.log(iter_num, train_loss=loss.item(), val_loss=None)
    log = read_metrics_log(tmp_path / "run")
    assert log.skipped == [] and "null" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    records = {r["step"]: r for r in log.records}
    assert sorted(records) == list(range(max_iters))
    assert [s for s, r in records.items() if "val_loss" in r] == [0, 4, 8, 12]
    assert [s for s, r in records.items() if "attn_entropy" in r] == [0, 4, 8, 12]
    assert all("gwu" in r and "train_loss" in r for r in records.values())
    assert not any("diverge" in f.title for f in diagnose(tmp_path / "run").findings)


# ------------------------------------------------------------------ a model read through the tap

def tutorial(n_layers: int = 2):
    torch.manual_seed(0)
    model = BatchedGPT(n_layers=n_layers)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def tutorial_steps(model, optimizer, monitor, steps) -> None:
    for step in steps:
        ids = tokens(2, 17, seed=step)  # [batch pos+1]
        _, loss = model(ids[:, :-1], ids[:, 1:])  # the tutorial's (logits, loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        monitor.log(step, train_loss=loss)


def test_tutorial_model_takes_int16_eval_tokens_and_refuses_a_deeper_resume(tmp_path):
    out = tmp_path / "run"
    model, optimizer = tutorial()
    with Monitor(model, optimizer, out, report=False, log_every=1, eval_every=2,
                 eval_tokens=tokens(2, 16).to(torch.int16)) as monitor:
        tutorial_steps(model, optimizer, monitor, range(3))
    records = read_metrics(out)
    assert [r["step"] for r in records] == [0, 1, 2] and len(records[2]["attn_entropy"]) == 2
    before = (out / "metrics.jsonl").read_bytes(), (out / "run.json").read_bytes()
    deeper, deeper_opt = tutorial(n_layers=4)
    refused(lambda: Monitor(deeper, deeper_opt, out, report=False, resume=True, eval_tokens=tokens(2, 16)),
            ValueError, str(out), "n_layers 2", "n_layers 4")
    assert ((out / "metrics.jsonl").read_bytes(), (out / "run.json").read_bytes()) == before
    # the same model goes on, its new eval records readable
    with Monitor(model, optimizer, out, report=False, resume=True, log_every=1, eval_every=2, start_step=3,
                 eval_tokens=tokens(2, 16)) as monitor:
        tutorial_steps(model, optimizer, monitor, range(3, 5))
    log = read_metrics_log(out)
    assert [r["step"] for r in log.records] == [0, 1, 2, 3, 4] and log.skipped == []
    assert len(log.records[4]["attn_entropy"]) == 2


@pytest.mark.parametrize("ids, words", [
    (tokens(2, 16, vocab=VOCAB) + VOCAB, ("BatchedGPT failed on eval_tokens", "[2, 16]")),
    (tokens(2, CTX + 8), ("BatchedGPT failed on eval_tokens", f"[2, {CTX + 8}]")),
])
def test_eval_tokens_the_tutorial_model_cannot_read_are_refused_when_made(tmp_path, ids, words):
    refused(lambda: Monitor(*tutorial(), tmp_path / "run", report=False, eval_tokens=ids), ValueError, *words)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the Trainer callback

class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int):
        self.rows = tokens(n, 16, seed=seed)  # [n pos]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class LoraLike(torch.nn.Module):
    """A PEFT-style wrapper: the base model frozen under `base_model`, a low-rank update added to
    layer 0's q_proj output (its only trainable weights)."""

    def __init__(self, base: torch.nn.Module, rank: int = 4):
        super().__init__()
        self.base_model = base
        self.config = base.config
        for p in base.parameters():
            p.requires_grad_(False)
        q = base.model.layers[0].self_attn.q_proj
        self.lora_A = torch.nn.Parameter(0.01 * torch.randn(rank, q.in_features))
        self.lora_B = torch.nn.Parameter(0.01 * torch.randn(q.out_features, rank))
        q.register_forward_hook(lambda module, inputs, out: out + inputs[0] @ self.lora_A.T @ self.lora_B.T)

    def forward(self, input_ids=None, labels=None, **kwargs):
        return self.base_model(input_ids=input_ids, labels=labels, **kwargs)


def hf_train(tmp_path, model, callbacks, save_strategy_steps: int = 0, resume: str | None = None, **options):
    transformers = pytest.importorskip("transformers")
    saving = {"save_strategy": "steps", "save_steps": save_strategy_steps} if save_strategy_steps else \
        {"save_strategy": "no"}
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), use_cpu=True, report_to=[], per_device_train_batch_size=2,
        per_device_eval_batch_size=4, learning_rate=1e-3, disable_tqdm=True, seed=0,
        eval_strategy="steps", **saving, **options)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows(24, 1), eval_dataset=Rows(4, 2),
                                   callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def hand_updates(param_of):
    """A callback measuring u of one weight around each real optimizer step, numbered as counted."""
    transformers = pytest.importorskip("transformers")

    class Hand(transformers.TrainerCallback):
        def __init__(self):
            self.u: dict[int, float] = {}

        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            weight, count = param_of(model), [0]
            optimizer = getattr(optimizer, "optimizer", optimizer)  # under accelerate's wrapper

            def before(*_):
                self.before = weight.detach().clone()

            def after(*_):
                count[0] += 1
                self.u[count[0]] = rms(weight.detach() - self.before) / rms(weight.detach())
            optimizer.register_step_pre_hook(before)
            optimizer.register_step_post_hook(after)
    return Hand()


def test_hf_gradient_accumulation_records_sit_at_optimizer_steps(tmp_path):
    from gpt_kit import hf_model
    from train.monitor import HFCallback
    hand = hand_updates(lambda m: m.model.layers[0].self_attn.q_proj.weight)
    callback = HFCallback(tmp_path / "run", log_every=2, eval_every=2, eval_tokens=tokens(2, 16), report=False)
    trainer = hf_train(tmp_path, hf_model("llama"), [callback, hand], max_steps=4, gradient_accumulation_steps=3,
                       logging_steps=1, eval_steps=2)
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert sorted(records) == [1, 2, 3, 4] and sorted(hand.u) == [1, 2, 3, 4]  # 4 optimizer steps, not 12
    for step in (2, 4):
        assert records[step]["gwu"]["model.layers.0.self_attn.q_proj.weight"]["u"] == pytest.approx(hand.u[step],
                                                                                                  rel=1e-5)
    for logged in trainer.state.log_history:
        if "loss" in logged:
            assert records[logged["step"]]["train_loss"] == logged["loss"]
        if "eval_loss" in logged:
            assert records[logged["step"]]["val_loss"] == logged["eval_loss"]


def test_hf_logging_steps_above_eval_steps(tmp_path):
    from gpt_kit import hf_model
    from train.monitor import HFCallback
    callback = HFCallback(tmp_path / "run", log_every=2, eval_every=2, eval_tokens=tokens(2, 16), report=False)
    trainer = hf_train(tmp_path, hf_model("llama"), [callback], max_steps=8, logging_steps=5, eval_steps=2)
    log = read_metrics_log(tmp_path / "run")
    records = {r["step"]: r for r in log.records}
    assert log.skipped == [] and sorted(records) == [2, 4, 5, 6, 8]
    assert [s for s, r in records.items() if "val_loss" in r] == [2, 4, 6, 8]
    assert [s for s, r in records.items() if "train_loss" in r] == [5]
    assert records[5]["train_loss"] == next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    assert all("gwu" in records[s] for s in (2, 4, 6, 8))


def test_hf_lora_like_wrapper_measures_the_trained_subset(tmp_path):
    from gpt_kit import hf_model
    from probes.doctor.diagnosis import run as diagnose
    from train.monitor import HFCallback
    model = LoraLike(hf_model("llama"))
    hand = hand_updates(lambda m: m.lora_B)
    callback = HFCallback(tmp_path / "run", log_every=1, eval_every=2, eval_tokens=tokens(2, 16), report=False)
    hf_train(tmp_path, model, [callback, hand], max_steps=4, logging_steps=1, eval_steps=2)
    records = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert sorted(records) == [1, 2, 3, 4]
    for step, record in records.items():
        assert sorted(record["gwu"]) == ["lora_A", "lora_B"]  # what the optimizer updates, not the frozen base
        assert record["gwu"]["lora_B"]["u"] == pytest.approx(hand.u[step], rel=1e-5)
    assert len(records[2]["attn_entropy"]) == 2 and len(records[4]["attn_entropy"]["0"]) == 4
    codes = {f.code for f in diagnose(tmp_path / "run").findings}
    assert "update_ratio_low" not in codes  # the frozen base is not "frozen parameters that barely move"


def test_hf_callback_refuses_an_empty_directory_and_a_misspelt_option_before_training(tmp_path):
    pytest.importorskip("transformers")
    from train.monitor import HFCallback
    refused(lambda: HFCallback(""), ValueError, "HFCallback", "out_dir")
    refused(lambda: HFCallback(tmp_path / "run", eval_token=tokens()), TypeError, "eval_token", "not a Monitor option",
            "eval_tokens")


def test_hf_on_log_takes_a_one_element_tensor_and_leaves_strings_out(tmp_path):
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from train.monitor import HFCallback
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    callback = HFCallback(tmp_path / "run", report=False, log_every=1)
    state = SimpleNamespace(max_steps=2, global_step=0)
    callback.on_train_begin(None, state, None, model=model, optimizer=optimizer)
    state.global_step = 1
    callback.on_log(None, state, None, logs={"loss": "2.5", "grad_norm": torch.tensor(0.75), "learning_rate": 0.1,
                                               "eval_loss": None})
    callback.on_train_end(None, state, None)
    (record,) = read_metrics(tmp_path / "run")
    assert record["grad_norm"] == 0.75 and "train_loss" not in record and "val_loss" not in record


def test_hf_resume_from_checkpoint_redoes_the_steps_after_it(tmp_path):
    """A Trainer resumed at checkpoint-3 of a run that logged to step 5: steps 4 and 5 are redone
    once each, every record readable, each with the update of its own step."""
    from gpt_kit import hf_model
    from train.monitor import HFCallback

    def train(max_steps: int, resume: str | None) -> None:
        callback = HFCallback(tmp_path / "run", log_every=1, eval_every=2, eval_tokens=tokens(2, 16), report=False)
        hf_train(tmp_path, hf_model("llama"), [callback], max_steps=max_steps, logging_steps=1, eval_steps=100,
                 save_strategy_steps=3, resume=resume)
    train(5, None)
    first = {r["step"]: r["train_loss"] for r in read_metrics(tmp_path / "run")}
    train(8, str(tmp_path / "hf" / "checkpoint-3"))
    log = read_metrics_log(tmp_path / "run")
    assert [r["step"] for r in log.records] == list(range(1, 9)) and log.skipped == []
    assert all("gwu" in r for r in log.records)
    assert [r["train_loss"] for r in log.records[:3]] == [first[1], first[2], first[3]]  # kept as they were
