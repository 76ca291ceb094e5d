"""Issue 37's speed of the doctor's readers on huge logs: a nanoGPT log is read a piece at a time in
numpy (probes.doctor.nanogpt_block), trainer_state.json's log_history a window of entries at a time
(json_stream.bulk_elements, read_trainer.History.add_many), and long histories are windowed from
columns (probes.doctor.thinning.Thinned.extend, thin_columns.Block). Each must give exactly what
the straightforward reading gives: every line to read_nanogpt.read_line, every entry to
History.add, every record to Thinned.append. Checked here on generated files with evals, NaN and
inf, restarts and resumes, damaged and prefixed lines, CRLF, exponents, steps too long to read,
non-numbers and steps out of order, with a small window cap and small pieces so that a few
thousand lines cross every edge."""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path

import numpy as np
import pytest

from probes.doctor import read_nanogpt, text_log, thinning
from probes.doctor.printed_runs import PrintedRuns
from probes.doctor.thin_columns import Rows
from probes.doctor.thinning import Thinned


def same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # floats by repr: bit for bit, NaN as text


# ------------------------------------------------------------------ Thinned.extend == append


def random_rows(rng: np.random.Generator, n: int, first: int, names: list[str]) -> tuple[np.ndarray, dict]:
    steps = first + np.cumsum(rng.integers(1, 3, n))
    columns = {}
    for name in names:
        values = rng.normal(2.0, 1.0, n)
        u = rng.random(n)
        values[u < 0.03] = math.nan
        values[(u > 0.03) & (u < 0.04)] = math.inf
        columns[name] = values
    return steps, columns


@pytest.mark.parametrize("seed", range(40))
def test_extend_gives_the_windows_of_append_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(3, 40))
    names = [["train_loss", "step_time_ms"], ["train_loss", "lr", "grad_norm"], ["lr"]][seed % 3]
    one, block = Thinned(cap=cap), Thinned(cap=cap)
    last = 0
    for _ in range(int(rng.integers(1, 10))):
        steps, columns = random_rows(rng, int(rng.integers(0, 300)), last, names)
        records = {}
        for i in rng.choice(len(steps), size=min(len(steps), 3), replace=False).tolist() if len(steps) else []:
            records[i] = {"step": int(steps[i]), "train_loss": 1.5, "val_loss": 2.5, "_better": True}
        for i, step in enumerate(steps.tolist()):
            one.append(dict(records[i]) if i in records else {"step": step, **{k: float(v[i]) for k, v in columns.items()}})
        block.extend(Rows(steps, columns, records))
        last = int(steps[-1]) if len(steps) else last
        if rng.random() < 0.4:  # a record appended alone between blocks (an eval, or one like the rows)
            last += 1
            record = {"step": last, "train_loss": 2.0, **({"val_loss": 2.0} if rng.random() < 0.5 else {})}
            one.append(dict(record))
            block.append(dict(record))
        assert (block.raw, block.width, block.thinned, block.cap) == (one.raw, one.width, one.thinned, one.cap)
        assert same(list(block), list(one))
    assert same(block.finish(), one.finish()) and block.windows_text() == one.windows_text()


# ------------------------------------------------------------------ nanoGPT logs, piece by piece == line by line


def reference(path: Path) -> tuple:
    """The log read line by line: every line to read_line (the reader before pieces)."""
    runs = PrintedRuns(path, keep=("train_loss",))
    for number, line in text_log.text_lines(path):
        read_nanogpt.read_line(number, line.strip(), runs)
    facts = runs.facts
    records, source = runs.finish(f"the nanoGPT log {path.name}")
    return records, source, facts, runs.long_numbers


def fast(path: Path) -> tuple:
    log = read_nanogpt.read_nanogpt_log(path)
    records = log.records
    per_step = log.train.get("tokens_per_step")
    assert per_step is None  # (tokens are derived after reading; not generated here)
    return records, log.source, {"train": log.train, "model": log.model}, log.skipped


def iter_line(step, loss, ms=12.5, mfu="5.00") -> str:
    return f"iter {step}: loss {loss}, time {ms}ms, mfu {mfu}%"


def number(rng: random.Random) -> str:
    """A printed loss: mostly nanoGPT's {:.4f}, sometimes NaN, inf, an exponent, a bare integer."""
    u = rng.random()
    if u < 0.03:
        return rng.choice(["nan", "-nan", "inf", "-inf"])
    if u < 0.05:
        return f"{rng.uniform(0, 5):.3e}"
    if u < 0.06:
        return str(rng.randint(0, 12))
    return f"{rng.uniform(0.5, 11.0):.4f}"


def run_lines(rng: random.Random, start: int, steps: int, header: bool, resume: bool = False) -> list[str]:
    lines = []
    if header:
        lines += ["Overriding config with config/train_shakespeare_char.py", f"max_iters = {start + steps}",
                  f"Overriding: learning_rate = {rng.choice(['1e-3', '0.5', '6e-4'])}",
                  "found vocab_size = 65 (inside data/shakespeare_char/meta.pkl)"]
        lines += ["Resuming training from out"] if resume else ["Initializing a new model from scratch"]
        lines += ["number of parameters: 10.65M"]
    for step in range(start, start + steps):
        u = rng.random()
        if step % 50 == 0 or u < 0.01:
            lines.append(f"step {step}: train loss {number(rng)}, val loss {number(rng)}")
            if rng.random() < 0.1:
                continue  # an eval with no iter line of its step after it
        if u < 0.005:
            lines.append(f"step {step + rng.choice([0, 1, -1])}: train loss 2.0000, val loss 2.1000")
        ms = rng.choice(["12.50", "9.87", "100.25", "1e+02", "13"])
        line = iter_line(step, number(rng), ms, rng.choice(["5.00", "-100.00", "12.34"]))
        v = rng.random()
        if v < 0.01:
            line = "[rank0] " + line  # prefixed: read by read_line's search
        elif v < 0.02:
            line = "  " + line + "  "
        elif v < 0.03:
            line = line.replace("loss ", "loss .")  # no number: not a step line
        elif v < 0.035:
            line = iter_line("1" * 20, "2.0")  # a step too long to read
        elif v < 0.04:
            line = f"iter {step}: loss 2.5, time 12.5ms, mfu 5.00% and more"
        elif v < 0.045:
            line = f"iter {step}: loss ٣.5, time 12.5ms, mfu 5.00%"  # not ASCII digits
        elif v < 0.05:
            line = f"iter {step}: loss {number(rng)}, time 12.5ms, mfu 5.00%\r"
        lines.append(line)
        if rng.random() < 0.002:
            lines.append("saving checkpoint to out")
    return lines


def write_log(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    lines = run_lines(rng, 0, rng.randint(100, 3000), header=rng.random() < 0.8)
    for _ in range(rng.randint(0, 3)):  # more runs appended (tee -a), or resumed, or a counter gone back
        kind = rng.choice(["new", "resume", "bare", "jump"])
        if kind == "new":
            lines += run_lines(rng, 0, rng.randint(50, 2000), header=True)
        elif kind == "resume":
            lines += run_lines(rng, rng.randint(0, 500), rng.randint(50, 2000), header=True, resume=True)
        elif kind == "bare":
            lines += run_lines(rng, rng.randint(0, 100), rng.randint(50, 1000), header=False)
        else:
            lines += run_lines(rng, 10**6, rng.randint(50, 1000), header=False)
    text = "\n".join(lines) + "\n" + ("iter 99999: loss 2.0" if rng.random() < 0.3 else "")
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.mark.parametrize("seed", range(12))
def test_a_generated_log_reads_as_line_by_line(tmp_path, monkeypatch, caplog, seed):
    path = write_log(tmp_path / "train.log", seed)
    monkeypatch.setattr(thinning, "CAP", [50, 200, 20_000][seed % 3])
    monkeypatch.setattr(text_log, "CHUNK", [1 << 12, 1 << 14, 1 << 20][seed % 3])
    want, got = both_ways(reference, fast, path, caplog)
    records, source, facts, long_numbers = want
    assert same(got[0], records) and got[1] == source and got[2] == facts and got[3] == len(long_numbers)


def both_ways(reference, fast, path: Path, caplog) -> tuple:
    """(what reference(path) gives, what fast(path) gives), each saying the same warnings
    (truncated, overlong, skipped lines; earlier runs)."""
    with caplog.at_level(logging.WARNING):
        want = reference(path)
    said = [r.getMessage() for r in caplog.records]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        got = fast(path)
    assert [r.getMessage() for r in caplog.records] == said
    return want, got


def test_a_diverged_run_of_nan_lines_reads_as_line_by_line(tmp_path, monkeypatch):
    lines = [iter_line(s, f"{2 + 1 / (s + 1):.4f}") for s in range(3000)]
    lines += [iter_line(s, "nan", "12.50") for s in range(3000, 5000)]
    lines += [f"step {s}: train loss nan, val loss nan" if s % 500 == 0 else iter_line(s, "nan") for s in range(5000, 6000)]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(thinning, "CAP", 100)
    want, got = reference(path), fast(path)
    assert same(got[0], want[0]) and got[1] == want[1] and "6,000 steps read" in got[1]


# ------------------------------------------------------------------ trainer_state.json, in bulk == entry by entry


def trainer_entries(rng: random.Random, n: int) -> list:
    """log_history entries as the Trainer writes them, with evals, NaN/Infinity, and now and then
    what is no entry: strings, nulls, booleans, no step, steps out of order or repeated, huge ints."""
    entries, step = [], 0
    for _ in range(n):
        step += rng.choice([1, 1, 1, 2, 5])
        u = rng.random()
        entry = {"epoch": round(step / 100, 2), "grad_norm": rng.uniform(0.1, 3.0), "learning_rate": 1e-4,
                 "loss": round(rng.uniform(0.5, 4.0), 4), "step": step}
        if rng.random() < 0.3:
            entry["num_input_tokens_seen"] = step * 4096
        if u < 0.02:
            entry["loss"] = rng.choice([math.nan, math.inf, -math.inf])
        elif u < 0.03:
            entry["grad_norm"] = math.inf
        elif u < 0.035:
            entry["loss"] = rng.choice(["nan?", None, True, [1.0]])
        elif u < 0.04:
            entry["step"] = rng.choice([float(step), str(step), None, 10**30])
        elif u < 0.045:
            entry["step"] = max(step - rng.randint(1, 30), 0)  # out of order, or a repeat
        elif u < 0.05:
            entry["grad_norm"] = 7 * 10**45  # an int over json_stream's MAX_INT_DIGITS
        elif u < 0.055:
            del entry["loss"]
        entries.append(entry)
        if rng.random() < 0.03:
            entries.append({"epoch": entry["epoch"], "eval_loss": rng.uniform(1, 4), "eval_runtime": 1.5, "step": step})
        if rng.random() < 0.005:
            entries.append(rng.choice([[1, 2], "x", 3]))
    return entries


def history(path: Path, bulk: bool):
    from probes.doctor.read_trainer import TRAINER_KEYS, History, read_json
    h = History(dict(TRAINER_KEYS))
    state = read_json(path, h.add, h.add_many if bulk else None)
    text = h.records.windows_text()
    records = h.records.finish()
    return records, text, state, sorted(h.present), h.entries, h.skipped_entries, repr(h.not_numbers)


@pytest.mark.parametrize("seed", range(10))
def test_a_generated_trainer_state_reads_as_entry_by_entry(tmp_path, monkeypatch, seed):
    from probes.doctor import json_stream
    rng = random.Random(seed)
    entries = trainer_entries(rng, rng.randint(200, 3000))
    path = tmp_path / "trainer_state.json"
    text = json.dumps({"best_metric": None, "log_history": entries, "max_steps": 5000}, indent=[None, 2][seed % 2])
    path.write_text(text.replace("7" + "0" * 45, "7" * 46))  # (a 46-digit int as written)
    monkeypatch.setattr(thinning, "CAP", [50, 300, 20_000][seed % 3])
    monkeypatch.setattr(json_stream, "CHUNK", [1 << 10, 1 << 13, 1 << 20][seed % 3])
    one, bulk = history(path, False), history(path, True)
    assert same(bulk[0], one[0]) and bulk[1:] == one[1:]


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.9])
def test_a_damaged_trainer_state_fails_where_entry_by_entry_does(tmp_path, monkeypatch, cut):
    from probes.doctor import json_stream
    from probes.errors import ProbeInputError
    text = json.dumps({"log_history": trainer_entries(random.Random(1), 2000)}, indent=2)
    at = int(len(text) * cut)
    path = tmp_path / "trainer_state.json"
    path.write_text(text[:at] + "}" + text[at:])
    monkeypatch.setattr(json_stream, "CHUNK", 1 << 12)
    errors = []
    for bulk in (False, True):
        with pytest.raises(ProbeInputError) as err:
            history(path, bulk)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and "line" in errors[0]
