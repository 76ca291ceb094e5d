"""Issue 45.4: llm.c's logs are read a piece at a time in numpy, as nanoGPT's are (probes.doctor.
read_llmc.LlmcLog.piece, probes.doctor.line_block), and must give exactly what taking every line
one at a time gives (LlmcLog.line): records, counts, the source's 'judged as N records', the
warnings. Checked on generated printed logs (train_gpt2.cu's and train_gpt2.c's lines) and main.log
files with val losses, NaN and inf, exponents, set-up tables, restarts and resumes, damaged,
prefixed and CRLF lines, steps too long to read, with a small window cap and small pieces."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from probes.doctor import read_llmc, text_log, thinning
from probes.doctor.read_llmc import LlmcLog, read_llmc_log
from test_doctor_fast_read import both_ways, same


def reference(path: Path):
    """The log read line by line: every line to LlmcLog.line."""
    reader = LlmcLog(path)
    for number, line in text_log.text_lines(path):
        reader.line(number, line)
    return reader.finish()


def loss(rng: random.Random, width: str = "7.6f") -> str:
    u = rng.random()
    if u < 0.03:
        return rng.choice(["nan", "-nan", "inf", "-inf"])
    return f"{rng.uniform(0.5, 11.0):{width}}"


def cu_line(rng: random.Random, step: int, total: int) -> str:
    lr = rng.choice([f"{rng.uniform(0, 6e-4):.2e}", "0.00e+00", f"{rng.uniform(1, 9):.2e}", "nan"])
    return (f"step {step:4d}/{total} | loss {loss(rng)} ({rng.uniform(-3, 3):+.2f}z)| norm {loss(rng, '6.4f')} "
            f"({rng.uniform(-3, 3):+.2f}z)| lr {lr} | {rng.uniform(5, 900):.2f} ms | 40.1% bf16 MFU | 163741 tok/s")


def printed_run(rng: random.Random, start: int, steps: int, header: bool) -> list[str]:
    lines = []
    if header:
        lines += ["+-----------------------+----------------------------------------------------+",
                  f"| max_steps             | {start + steps:<50} |",
                  f"| learning rate (LR)    | {rng.choice(['6.000000e-04', '3.000000e-04']):<50} |",
                  "| vocab_size V          | 50257                                              |",
                  "+-----------------------+----------------------------------------------------+"]
    c_style = rng.random() < 0.3
    for step in range(start, start + steps):
        if step % 20 == 0 or rng.random() < 0.01:
            lines.append(f"val loss {loss(rng, 'f')}")
            if rng.random() < 0.3:
                lines.append("HellaSwag: 2513/10042 = 0.250249")
        line = f"step {step}: train loss {loss(rng, 'f')} (took {rng.uniform(5, 900):f} ms)" if c_style \
            else cu_line(rng, step + 1, start + steps)
        v = rng.random()
        if v < 0.01:
            line = "  " + line
        elif v < 0.02:
            line = line.replace("loss ", "loss x")  # damaged: no number
        elif v < 0.025:
            line = f"step {'1' * 20}/40 | loss 2.0 | norm 1.0 | lr 1e-4 | 10.0 ms"  # a step too long to read
        elif v < 0.035:
            line += "\r"
        elif v < 0.04:
            line = cu_line(rng, step + rng.choice([0, 1, 2]), start + steps + 7)  # a step printed twice, or ahead
        lines.append(line)
        if rng.random() < 0.003:
            lines.append("generating:\n---\nthe cat sat\n---")
    if not c_style and rng.random() < 0.5:  # a last line whose total differs (the run's facts take the last)
        lines.append(cu_line(rng, start + steps + 1, start + steps + 9))
    if rng.random() < 0.5:
        lines.append(f"val loss {loss(rng, 'f')}")  # after the last step
    return lines


def main_run(rng: random.Random, start: int, steps: int) -> list[str]:
    lines = []
    for step in range(start, start + steps):
        if step % 25 == 0:
            lines.append(f"s:{step} tel:{loss(rng, '.4f')}")
            if rng.random() < 0.5:
                lines.append(f"s:{step} eval:{rng.random():.4f}")
        line = f"s:{step} trl:{loss(rng, '.4f')} lr:{rng.uniform(0, 6e-4):.6f} norm:{loss(rng, '.2f')}"
        v = rng.random()
        if v < 0.01:
            line = f"s:{step} trl:{loss(rng, '.4f')}"  # without lr and norm
        elif v < 0.015:
            line = f"s:{'9' * 19} trl:2.0000 lr:0.000100 norm:1.00"
        elif v < 0.02:
            line = line[: len(line) // 2]  # cut
        lines.append(line)
    return lines


def write_log(path: Path, seed: int) -> Path:
    rng = random.Random(seed)
    main = path.name == "main.log"
    lines = main_run(rng, 0, rng.randint(100, 2500)) if main else printed_run(rng, 0, rng.randint(100, 2500), True)
    for _ in range(rng.randint(0, 3)):  # appended again from 0 (a new run), from later (a resume), or far ahead
        start = rng.choice([0, rng.randint(1, 300), 10**6])
        lines += main_run(rng, start, rng.randint(50, 1500)) if main \
            else printed_run(rng, start, rng.randint(50, 1500), rng.random() < 0.7)
    text = "\n".join(lines) + "\n" + ("step  99/100 | loss 2.0" if rng.random() < 0.3 else "")
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.mark.parametrize("seed", range(12))
def test_a_generated_llmc_log_reads_as_line_by_line(tmp_path, monkeypatch, caplog, seed):
    path = write_log(tmp_path / ("main.log" if seed % 3 == 2 else "train.log"), seed)
    monkeypatch.setattr(thinning, "CAP", [50, 200, 20_000][seed % 3])
    monkeypatch.setattr(text_log, "CHUNK", [1 << 12, 1 << 14, 1 << 20][seed % 4 % 3])
    want, got = both_ways(reference, read_llmc_log, path, caplog)
    assert same(got.records, want.records) and got.source == want.source
    assert (got.model, got.train, got.skipped, got.formats) == (want.model, want.train, want.skipped, want.formats)
    if seed % 3 == 0:
        assert "steps read, judged as" in got.source  # the windows were made in both


def test_a_diverged_main_log_reads_as_line_by_line(tmp_path, monkeypatch):
    lines = [f"s:{s} trl:{2 + 1 / (s + 1):.4f} lr:0.000600 norm:{0.5 + s / 1e4:.2f}" for s in range(3000)]
    lines += [f"s:{s} trl:nan lr:0.000600 norm:-nan" for s in range(3000, 5000)]
    lines += [f"s:{s} tel:nan" if s % 500 == 0 else f"s:{s} trl:nan lr:6.0e-04 norm:inf" for s in range(5000, 6000)]
    path = tmp_path / "main.log"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(thinning, "CAP", 100)
    want, got = reference(path), read_llmc_log(path)
    assert same(got.records, want.records) and got.source == want.source and "6,000 steps read" in got.source
    assert got.records[0] == {"step": 0, "train_loss": 3.0, "lr": 0.0006, "grad_norm": 0.5}


def test_exponents_read_by_column_are_what_float_reads(tmp_path):
    """C's %.2e as mantissa over a power of ten: every value exactly float()'s."""
    rng = random.Random(0)
    values = [f"{rng.uniform(0, 10) * 10 ** rng.randint(-12, 3):.2e}" for _ in range(3000)]
    path = tmp_path / "train.log"
    path.write_text("".join(f"step {s + 1:4d}/3000 | loss 2.000000 (+0.00z)| norm 1.0000 (+0.00z)| lr {v} | "
                            "10.00 ms | 40.1% bf16 MFU | 1000 tok/s\n" for s, v in enumerate(values)))
    records = read_llmc_log(path).records
    assert [r["lr"] for r in records] == [float(v) for v in values]
    assert read_llmc.SHAPES.cache  # (read by column, not line by line)
