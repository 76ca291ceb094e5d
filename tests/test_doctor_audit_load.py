"""Issue 37's load cases, small: a history longer than thinning.CAP is kept in windows while it
is read (memory flat in the file's length), and the doctor answers on it as on the whole history:
the same verdict and findings, the divergence at the same step, a gradient spike kept, the source
saying it was thinned. CAP is lowered here so that a few thousand lines stand for millions;
benchmarks/bench_doctor_logs.py measures the real sizes."""

from __future__ import annotations

import json
import math
import tracemalloc

import pytest

from probes import diagnose
from probes.doctor import thinning
from probes.doctor.run_history import RunHistory
from test_doctor_logs import write


def nanogpt_lines(n: int, loss, eval_every: int = 250) -> str:
    lines = [f"max_iters = {n}", "found vocab_size = 65 (inside meta.pkl)"]
    for it in range(n):
        if it % eval_every == 0:
            lines.append(f"step {it}: train loss {loss(it) - 0.01:.4f}, val loss {loss(it) + 0.02:.4f}")
        lines.append(f"iter {it}: loss {loss(it):.4f}, time 12.50ms, mfu 5.00%")
    return "\n".join(lines) + "\n"


def healthy(it: int) -> float:
    return 2.0 + 2.2 * math.exp(-it / 800)


def diverging(it: int) -> float:
    return math.nan if it >= 3001 else healthy(it) + (math.exp((it - 2500) / 100) - 1 if it > 2500 else 0.0)


def summary(d) -> tuple:
    return d.verdict, sorted((f.code, f.severity) for f in d.findings), d.last_step


@pytest.mark.parametrize("loss", [healthy, diverging], ids=["healthy", "diverging"])
def test_a_thinned_log_is_judged_as_the_whole_one(tmp_path, monkeypatch, loss):
    log = write(tmp_path / "train.log", nanogpt_lines(4000, loss))
    whole = diagnose.run(None, log=log)
    monkeypatch.setattr(thinning, "CAP", 300)
    thinned = diagnose.run(None, log=log)
    assert "4,000 steps read, judged as" in thinned.source and "steps read" not in whole.source
    assert summary(thinned) == summary(whole)
    if loss is diverging:
        assert next(f for f in thinned.findings if f.code == "divergence").step == 3001


def trainer_state(path, n: int, spike_at: int | None = None) -> None:
    history = [{"grad_norm": 50.0 if s == spike_at else 1.0 + (s % 3) / 10, "learning_rate": 1e-4,
                "loss": 2.0 + 2.2 * math.exp(-s / 800), "step": s} for s in range(1, n + 1)]
    history += [{"eval_loss": 2.1 + 2.2 * math.exp(-s / 800), "step": s} for s in range(500, n + 1, 500)]
    history.sort(key=lambda e: e["step"])
    write(path, json.dumps({"log_history": history, "max_steps": n}, indent=2))


def test_a_gradient_spike_survives_the_windows(tmp_path, monkeypatch):
    path = tmp_path / "trainer_state.json"
    trainer_state(path, 4000, spike_at=2222)
    whole = RunHistory.read(None, log=path)
    monkeypatch.setattr(thinning, "CAP", 300)
    h = RunHistory.read(None, log=path)
    assert len(h.records) <= 300 + 8 and len(whole.records) == 4000
    assert max(r.get("grad_norm", 0) for r in h.records) == 50.0
    evals = [r["step"] for r in h.records if "val_loss" in r]
    assert evals == [r["step"] for r in whole.records if "val_loss" in r]  # every eval kept, at its step
    weights = sum(1 for r in whole.records if "train_loss" in r)
    assert h.records[0] == whole.records[0] and h.records[-1]["step"] == 4000 and weights == 4000
    assert summary(diagnose.run(None, log=path)) == summary(diagnose.diagnose_history(whole))


def test_window_means_are_the_means_of_their_steps():
    t = thinning.Thinned(cap=8)
    for s in range(40):
        t.append({"step": s, "train_loss": float(s), "grad_norm": float(s % 5)})
    records = t.finish()
    # each window's loss is the mean of the consecutive steps it stands for, ending at its step
    previous = records[0]["step"]
    for r in records[1:]:
        steps = range(previous + 1, r["step"] + 1)
        assert r["train_loss"] == pytest.approx(sum(steps) / len(steps))
        assert r["grad_norm"] == max(s % 5 for s in steps)
        previous = r["step"]
    assert previous == 39 and len(records) <= t.cap + t.width + 1


def peak_reading(path, monkeypatch) -> int:
    """Peak traced memory of reading `path`, in pieces of 16 KiB (so that small files show it)."""
    from probes.doctor import json_stream, text_log
    monkeypatch.setattr(thinning, "CAP", 300)
    monkeypatch.setattr(text_log, "CHUNK", 1 << 14)
    monkeypatch.setattr(json_stream, "CHUNK", 1 << 14)
    tracemalloc.start()
    RunHistory.read(None, log=path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_memory_is_flat_in_the_files_length(tmp_path, monkeypatch):
    short = write(tmp_path / "short.log", nanogpt_lines(5_000, healthy, eval_every=10**9))
    long = write(tmp_path / "long.log", nanogpt_lines(20_000, healthy, eval_every=10**9))
    a, b = peak_reading(short, monkeypatch), peak_reading(long, monkeypatch)
    assert b < 1.3 * a, (a, b)  # 4x the lines, not 4x the memory
    s1, s2 = tmp_path / "a" / "trainer_state.json", tmp_path / "b" / "trainer_state.json"
    trainer_state(s1, 2_500)
    trainer_state(s2, 10_000)
    a, b = peak_reading(s1, monkeypatch), peak_reading(s2, monkeypatch)
    assert b < 1.3 * a, (a, b)


def test_a_fp16_skip_in_a_thinned_run_is_still_counted(tmp_path, monkeypatch):
    path = tmp_path / "trainer_state.json"
    trainer_state(path, 3000)
    data = json.loads(path.read_text())
    for e in data["log_history"]:
        if e["step"] in (1500, 2500) and "grad_norm" in e:
            e["grad_norm"] = float("inf")
    path.write_text(json.dumps(data))
    whole = diagnose.run(None, log=path)
    monkeypatch.setattr(thinning, "CAP", 200)
    thinned = diagnose.run(None, log=path)
    assert summary(thinned) == summary(whole)
    assert sum(1 for r in RunHistory.read(None, log=path).records if r.get("grad_norm") == float("inf")) == 2


def test_a_log_of_mostly_evals_is_read_in_linear_time_with_every_eval_kept(tmp_path, monkeypatch):
    """Evals never merge: past the cap, the cap grows instead of compacting at every line."""
    import time
    log = write(tmp_path / "train.log", nanogpt_lines(20_000, healthy, eval_every=2))
    monkeypatch.setattr(thinning, "CAP", 100)
    start = time.perf_counter()
    h = RunHistory.read(None, log=log)
    assert time.perf_counter() - start < 5.0
    assert sum(1 for r in h.records if "val_loss" in r) == 10_000 and h.last_step == 19_999
