"""Issue 37, the Monitor under bad input (a plain loop's user): what it is given at construction,
the steps and values `log` takes, its life (close, a second Monitor, a resume onto another model).
Every refusal is one line naming the problem (and the run directory where one is involved), and
nothing already on disk is lost; what a user may rightly pass (None for "not measured", a numpy
step, int16 token ids) is taken and read right."""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest
import torch
from nanogpt_ref import GPT, GPTConfig

from models.checkpoint import read_metrics
from train.monitor import Monitor

CONFIG = GPTConfig(block_size=16, vocab_size=65, n_layer=2, n_head=4, n_embd=32)


def model_and_sgd(config: GPTConfig = CONFIG, seed: int = 0):
    torch.manual_seed(seed)
    model = GPT(config)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, optimizer, seed: int) -> float:
    tokens = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.block_size + 1),
                           generator=torch.Generator().manual_seed(seed))  # [batch pos+1]
    logits = model(tokens[:, :-1])  # [batch pos vocab]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def refused(fn, kind=ValueError, *words: str) -> str:
    with pytest.raises(kind) as err:
        fn()
    text = str(err.value)
    assert "\n" not in text and len(text) < 400 and all(w in text for w in words), text
    return text


def on_disk(path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def meta_gpt():
    with torch.device("meta"):
        return GPT(CONFIG)


class HoldsItself:
    def __init__(self):
        self.optimizer = self


# ------------------------------------------------------------------ construction

def bad_model(name):
    model, sgd = model_and_sgd()
    other, _ = model_and_sgd(seed=1)
    return {
        "None model": (None, sgd, TypeError, ("torch.nn.Module", "NoneType")),
        "string model": ("model", sgd, TypeError, ("torch.nn.Module", "str", "'model'")),
        "meta model": (meta_gpt(), torch.optim.SGD(meta_gpt().parameters(), lr=0.1), ValueError,
                       ("meta device", "to_empty")),
        "no parameters": (torch.nn.ReLU(), torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
                          ValueError, ("ReLU", "no parameters")),
        "None optimizer": (model, None, TypeError, ("torch optimizer", "NoneType")),
        "string optimizer": (model, "adamw", TypeError, ("torch optimizer", "str")),
        "a wrapper holding itself": (model, HoldsItself(), TypeError, ("torch optimizer", "HoldsItself")),
        "another model's optimizer": (model, torch.optim.SGD(other.parameters(), lr=0.1), ValueError,
                                      ("updates none of the GPT's parameters",)),
    }[name]


@pytest.mark.parametrize("name", ["None model", "string model", "meta model", "no parameters", "None optimizer",
                                  "string optimizer", "a wrapper holding itself", "another model's optimizer"])
def test_a_model_or_optimizer_it_cannot_watch_is_one_line_and_writes_nothing(tmp_path, name):
    model, optimizer, kind, words = bad_model(name)
    refused(lambda: Monitor(model, optimizer, tmp_path / "run", report=False), kind, *words)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("out_dir", ["", "  ", None, 3])
def test_an_empty_or_missing_run_directory_is_refused_not_the_working_directory(tmp_path, monkeypatch, out_dir):
    monkeypatch.chdir(tmp_path)
    refused(lambda: Monitor(*model_and_sgd(), out_dir, report=False), ValueError, "out_dir", "run directory")
    assert list(tmp_path.iterdir()) == []  # no metrics.jsonl, run.json or lock in the working directory


@pytest.mark.parametrize("option, value, words", [
    ("steps", "10", ("steps", "'10'")),
    ("tokens_per_step", "4", ("tokens_per_step", "'4'")),  # step * "4" would have been a string
    ("steps", -1, ("steps", "-1")),
    ("start_step", 10**5000, ("start_step", "16610 bits")),  # no int-to-str limit message
    ("start_step", 2**63, ("start_step", "2**63")),
    ("log_every", 0, ("log_every", ">= 1")),
], ids=["steps-str", "tokens-str", "steps-negative", "start-5000-digits", "start-2**63", "log_every-0"])
def test_bad_settings_are_one_line(tmp_path, option, value, words):
    refused(lambda: Monitor(*model_and_sgd(), tmp_path / "run", report=False, **{option: value}), ValueError, *words)


def test_numpy_integer_settings_are_taken(tmp_path):
    model, sgd = model_and_sgd()
    with Monitor(model, sgd, tmp_path / "run", report=False, log_every=np.int64(2), steps=np.int32(4)) as monitor:
        for step in range(4):
            monitor.log(step, train_loss=train_step(model, sgd, step))
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [0, 2, 3]  # log_every 2, not refused; 3 the last


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
def test_token_ids_of_any_integer_dtype_measure_as_long_ones_do(tmp_path, dtype):
    ids = torch.randint(0, CONFIG.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))  # [batch pos]
    internals = {}
    for name, tokens in (("long", ids), ("narrow", ids.to(dtype))):
        model, sgd = model_and_sgd()
        with Monitor(model, sgd, tmp_path / name, report=False, eval_every=1, eval_tokens=tokens) as monitor:
            monitor.log(0, train_loss=4.0)
        internals[name] = read_metrics(tmp_path / name)[0]["attn_entropy"]
    assert internals["narrow"] == internals["long"] and len(internals["long"]) == CONFIG.n_layer


@pytest.mark.parametrize("tokens, words", [
    (np.zeros((2, 8), dtype=np.int64), ("torch tensor", "ndarray", "torch.from_numpy")),
    (torch.zeros(2, 8, dtype=torch.bool), ("integer token ids", "torch.bool")),
    (torch.zeros(2, 8), ("integer token ids", "torch.float32")),
    (torch.zeros(0, 8, dtype=torch.long), ("eval_tokens", "at least one token", "[0, 8]")),
    (torch.zeros(2, 0, dtype=torch.long), ("eval_tokens", "at least one token", "[2, 0]")),
    (torch.zeros(2, 8, dtype=torch.long, device="meta"), ("eval_tokens", "meta device")),
    ([[1, 2, 3]], ("torch tensor", "list")),
])
def test_eval_tokens_that_cannot_be_read_are_named_when_the_monitor_is_made(tmp_path, tokens, words):
    refused(lambda: Monitor(*model_and_sgd(), tmp_path / "run", report=False, eval_tokens=tokens), ValueError, *words)
    assert not (tmp_path / "run").exists()  # not at step 0, after the run began


def test_an_autocast_context_itself_is_taken_as_nanogpt_holds_it(tmp_path):
    """nanoGPT's `ctx = torch.amp.autocast(...)` is a context manager, not a function making one."""
    ids = torch.randint(0, CONFIG.vocab_size, (2, 8), generator=torch.Generator().manual_seed(3))  # [batch pos]
    entropy = {}
    for name, autocast in (("instance", torch.autocast("cpu", enabled=False)), ("factory", None)):
        model, sgd = model_and_sgd()
        options = {} if autocast is None else {"autocast": autocast}
        with Monitor(model, sgd, tmp_path / name, report=False, eval_every=1, eval_tokens=ids, **options) as monitor:
            monitor.log(0, train_loss=4.0)
        entropy[name] = read_metrics(tmp_path / name)[0]["attn_entropy"]
    assert entropy["instance"] == entropy["factory"]
    refused(lambda: Monitor(*model_and_sgd(), tmp_path / "bad", report=False, autocast="bf16"), TypeError,
            "autocast", "'bf16'")


# ------------------------------------------------------------------ log: steps and values

@pytest.fixture()
def run(tmp_path):
    """A Monitor logging every step, with step 0 already written."""
    model, sgd = model_and_sgd()
    monitor = Monitor(model, sgd, tmp_path / "run", report=False, log_every=1)
    monitor.log(0, train_loss=train_step(model, sgd, 0))
    monitor.flush()
    yield monitor, model, sgd, tmp_path / "run"
    monitor.close()


@pytest.mark.parametrize("step, words", [
    (2**63, ("below 2**63", "64 bits")),
    (2**70, ("below 2**63",)),
    (10**5000, ("below 2**63", "16610 bits")),
    (-(10**5000), ("non-negative integer", "16610 bits")),
    (3.0, ("non-negative integer", "float 3.0")),
    (torch.tensor(3), ("non-negative integer", "step.item()")),
    (True, ("non-negative integer", "bool")),
    ("3", ("non-negative integer", "str")),
    (None, ("non-negative integer", "NoneType")),
], ids=["2**63", "2**70", "5000-digits", "minus-5000-digits", "float", "tensor", "bool", "str", "None"])
def test_a_step_the_readers_cannot_hold_is_refused_and_the_history_kept(run, step, words):
    monitor, model, sgd, out = run
    before = on_disk(out)
    refused(lambda: monitor.log(step, train_loss=2.0), ValueError, "step", *words)
    monitor.flush()
    assert on_disk(out) == before


def test_numpy_integer_steps_are_steps(run):
    monitor, model, sgd, out = run
    for step in (np.int64(1), np.int32(2), np.uint16(3)):
        monitor.log(step, train_loss=train_step(model, sgd, int(step)))
    monitor.flush()
    records = read_metrics(out)
    assert [r["step"] for r in records] == [0, 1, 2, 3] and all(type(r["step"]) is int for r in records)
    assert all("gwu" in r for r in records)  # each step's own update measured: the numbering followed


def test_tokens_past_64_bits_are_written_as_a_float(tmp_path):
    model, sgd = model_and_sgd()
    step = 2**62 + 10
    with Monitor(model, sgd, tmp_path / "run", report=False, log_every=1, tokens_per_step=4) as monitor:
        monitor.log(step, train_loss=2.0)
    (record,) = read_metrics(tmp_path / "run")
    assert record["step"] == step and record["tokens"] == float(4 * step) and isinstance(record["tokens"], float)


def test_steps_going_back_are_refused_and_nothing_written(run):
    monitor, model, sgd, out = run
    monitor.log(5, train_loss=train_step(model, sgd, 5))
    refused(lambda: monitor.log(3, train_loss=2.0), ValueError, "step 3 after step 5", "must not go back")
    monitor.flush()
    assert [r["step"] for r in read_metrics(out)] == [0, 5]


@pytest.mark.parametrize("name", ["gwu", "activations", "attn_entropy", "attn_logit_max", "resid_rms",
                                  "diverged", "lr_groups"])
def test_a_name_the_monitor_writes_is_refused_and_the_steps_loss_is_not_lost(run, name):
    monitor, model, sgd, out = run
    loss = train_step(model, sgd, 1)
    refused(lambda: monitor.log(1, train_loss=loss, **{name: 1.0}), ValueError, repr(name), "another name")
    monitor.log(1, train_loss=loss, **{f"my_{name}": 1.0})  # under its own name it is kept
    monitor.flush()
    records = read_metrics(out)  # every record readable (none skipped by the readers' check)
    assert [r["step"] for r in records] == [0, 1]
    assert records[1]["train_loss"] == loss and records[1][f"my_{name}"] == 1.0


def test_val_loss_none_on_steps_without_an_eval_is_not_measured_and_the_run_is_not_diverged(tmp_path):
    from probes.doctor.diagnosis import run as diagnose
    found = {}
    for way in ("none", "left out"):
        model, sgd = model_and_sgd()
        out = tmp_path / way.replace(" ", "_")
        with Monitor(model, sgd, out, report=False, log_every=1, eval_every=0) as monitor:
            for step in range(12):
                val = 4.0 - 0.01 * step if step % 4 == 0 else None
                given = {"val_loss": val, "lr": None, "grad_norm": None} if way == "none" else \
                    ({"val_loss": val} if val is not None else {})
                monitor.log(step, train_loss=train_step(model, sgd, step), **given)
        records = read_metrics(out)
        assert [r["step"] for r in records if "val_loss" in r] == [0, 4, 8]
        assert all(r["lr"] == 0.1 and r["grad_norm"] > 0 for r in records)  # None did not wipe the measured ones
        diagnosis = diagnose(out)
        assert not any("diverge" in f.title or "nan" in f.title.lower() for f in diagnosis.findings)
        found[way] = (diagnosis.verdict, [f.code for f in diagnosis.findings])
    assert "null" not in (tmp_path / "none" / "metrics.jsonl").read_text()
    assert found["none"] == found["left out"]  # None is "not measured", as if not given


def test_val_loss_none_between_log_steps_makes_no_record(tmp_path):
    model, sgd = model_and_sgd()
    with Monitor(model, sgd, tmp_path / "run", report=False, log_every=5, eval_every=0) as monitor:
        for step in range(10):
            monitor.log(step, train_loss=train_step(model, sgd, step), val_loss=None)
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 5, 9]  # 9: the run's last step, recorded at close
    assert "val_loss" not in records[-1]


@pytest.mark.parametrize("value, words", [
    ("2.0", ("must be a number", "str")),
    (True, ("must be a number", "bool")),
    (1j, ("must be a number", "complex")),
    ({"a": 1}, ("must be a number", "dict")),
    (10**5000, ("64 bits", "16610 bits")),
    (2**64, ("64 bits",)),
    (np.array([1.5, 2.5]), ("one number", "[2]")),
    (torch.ones(2), ("one number", "[2]")),
    (torch.ones((), device="meta"), ("one number", "meta")),
    (Fraction(10**400, 3), ("too large for a float", "Fraction")),
], ids=["str", "bool", "complex", "dict", "5000-digits", "2**64", "numpy-2", "tensor-2", "meta", "fraction"])
def test_a_value_that_is_not_one_number_is_refused_and_the_history_kept(run, value, words):
    monitor, model, sgd, out = run
    before = on_disk(out)
    refused(lambda: monitor.log(1, train_loss=2.0, extra=value), ValueError, "extra", *words)
    monitor.flush()
    assert on_disk(out) == before


def test_numbers_in_other_forms_are_read_as_numbers(run):
    monitor, model, sgd, out = run
    monitor.log(1, train_loss=torch.tensor(2.5, requires_grad=True) * 1, a=np.float32(0.5), b=np.array([1.5]),
                c=np.int64(7), d=torch.tensor([3]))
    monitor.flush()
    record = read_metrics(out)[1]
    assert (record["train_loss"], record["a"], record["b"], record["c"], record["d"]) == (2.5, 0.5, 1.5, 7, 3)


def test_a_nonfinite_loss_is_kept_as_the_divergence_it_is(run):
    monitor, model, sgd, out = run
    monitor.log(1, train_loss=float("nan"), val_loss=float("inf"))
    monitor.flush()
    record = read_metrics(out)[1]
    assert record["diverged"]["first_nonfinite_loss_step"] == 1 and "train loss is nan" in record["diverged"]["reason"]


def test_a_numpy_nan_between_log_steps_is_remembered_as_where_it_began(tmp_path):
    model, sgd = model_and_sgd()
    with Monitor(model, sgd, tmp_path / "run", report=False, log_every=4) as monitor:
        for step in range(5):
            loss = train_step(model, sgd, step)
            monitor.log(step, train_loss=np.float32("nan") if step >= 2 else np.float32(loss))
    last = read_metrics(tmp_path / "run")[-1]
    assert last["step"] == 4 and last["diverged"]["first_nonfinite_loss_step"] == 2


# ------------------------------------------------------------------ life: close, twice, before a step

def test_log_after_close_is_refused_naming_the_run_and_nothing_is_added(run):
    monitor, model, sgd, out = run
    monitor.close()
    before = on_disk(out)
    refused(lambda: monitor.log(1, train_loss=2.0), ValueError, "closed", str(out), "resume=True")
    refused(lambda: monitor.record(1, train_loss=2.0), ValueError, "closed")
    assert monitor.close() is None and monitor.flush() is None  # closing again is harmless
    assert on_disk(out) == before and not (out / ".train.lock").exists()


def test_two_monitors_on_one_directory_in_one_process(run):
    monitor, model, sgd, out = run
    before = on_disk(out)
    refused(lambda: Monitor(model, sgd, out, report=False, resume=True), ValueError, str(out),
            f"pid {os.getpid()}", "another Monitor", "close that one first")
    assert on_disk(out) == before


def test_a_finished_run_is_not_overwritten_without_resume(run):
    monitor, model, sgd, out = run
    monitor.close()
    before = on_disk(out)
    refused(lambda: Monitor(model, sgd, out, report=False), ValueError, str(out), "already holds a run")
    assert on_disk(out) == before


def test_log_before_any_optimizer_step_is_the_update_that_follows_it(tmp_path):
    model, sgd = model_and_sgd()
    with Monitor(model, sgd, tmp_path / "run", report=False, log_every=1) as monitor:
        monitor.log(0, train_loss=4.2)  # nanoGPT logs iter 0 before its first step: not an error
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        train_step(model, sgd, 1)
    (record,) = read_metrics(tmp_path / "run")
    assert (record["step"], record["lr"], record["train_loss"]) == (0, 0.1, 4.2)
    after = model.transformer.wte.weight.detach()
    moved = (after - before["transformer.wte.weight"]).norm().item()
    assert record["gwu"]["transformer.wte.weight"]["u"] == pytest.approx(
        moved / after.norm().item(), rel=1e-4)  # u = rms(dw) / rms(w after): the step taken after it


# ------------------------------------------------------------------ resume

def two_layer_run(out) -> None:
    model, sgd = model_and_sgd()
    with Monitor(model, sgd, out, report=False, log_every=1) as monitor:
        for step in range(2):
            monitor.log(step, train_loss=train_step(model, sgd, step))


def test_resume_with_another_model_is_refused_naming_both(tmp_path):
    out = tmp_path / "run"
    two_layer_run(out)
    before = on_disk(out)
    deeper = GPTConfig(block_size=16, vocab_size=65, n_layer=4, n_head=4, n_embd=32)
    model, sgd = model_and_sgd(deeper)
    tokens = torch.randint(0, 65, (2, 8))  # [batch pos]
    text = refused(lambda: Monitor(model, sgd, out, report=False, resume=True, eval_tokens=tokens), ValueError,
                   str(out), "n_layers 2", "n_layers 4", "another model")
    assert "run.json" in text
    assert on_disk(out) == before


def test_resume_with_the_same_model_goes_on_and_gets_run_jsons_model_filled_in(tmp_path):
    out = tmp_path / "run"
    two_layer_run(out)  # no eval_tokens: run.json has our config all the same (nanoGPT is read by the store)
    model, sgd = model_and_sgd()
    with Monitor(model, sgd, out, report=False, resume=True, log_every=1, eval_every=1, start_step=2,
                 eval_tokens=torch.randint(0, 65, (2, 8))) as monitor:
        monitor.log(2, train_loss=train_step(model, sgd, 2))
    records = read_metrics(out)  # every eval record fits the model run.json names: none skipped
    assert [r["step"] for r in records] == [0, 1, 2] and len(records[2]["attn_entropy"]) == CONFIG.n_layer
