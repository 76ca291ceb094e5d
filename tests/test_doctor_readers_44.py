"""Issue 44's audit of the doctor's readers, each case the right answer or one clear line: a line of
300 KB in the middle of a log (the 29 lines after it were dropped), random bytes (said to hold "no
nanoGPT lines"), llm.c's and nanoGPT's lines interleaved (read as HEALTHY from the llm.c lines
without a word), main.log followed by the run's printed lines (its 2,000 steps replaced without a
word). The files are written here in the formats' own words."""

from __future__ import annotations

import logging
import random

import pytest

from probes import diagnose
from test_doctor_logs import cli, healthy_loss, one_error_line, write


def iter_lines(steps, loss=healthy_loss) -> list[str]:
    return [f"iter {s}: loss {loss(s):.4f}, time 12.50ms, mfu 5.00%" for s in steps]


def cu_lines(steps, loss=healthy_loss, total=40) -> list[str]:
    """train_gpt2.cu's step lines, numbered from 1."""
    return [f"step {s + 1:4d}/{total} | loss {loss(s):7.6f} (+0.00z)| norm 1.0000 (+0.00z)| lr 3.00e-04 | "
            "120.00 ms | 40.1% bf16 MFU | 163741 tok/s" for s in steps]


def test_a_300_kb_line_is_skipped_and_the_log_read_on(tmp_path, caplog):
    lines = iter_lines(range(20)) + ["x" * 300_000] + iter_lines(range(20, 49))
    with caplog.at_level(logging.WARNING):
        d = diagnose.run(None, log=write(tmp_path / "train.log", "\n".join(lines) + "\n"))
    assert d.last_step == 48 and d.points == 49  # the 29 lines after it were lost
    assert d.skipped_records == 1 and "1 malformed line skipped" in d.format().splitlines()[0]
    assert "skipped 1 line over 65536 characters" in caplog.text and "truncated last line" not in caplog.text


def test_random_bytes_are_named_a_binary_file(tmp_path, capsys):
    rng = random.Random(0)
    for i in range(8):  # whether or not a NUL comes before the first line break
        data = bytes(rng.getrandbits(8) for _ in range(5000))
        path = tmp_path / f"noise{i}.log"
        path.write_bytes(data)
        code, out, err = cli(capsys, "--log", str(path))
        assert code == 2 and out == "" and f"noise{i}.log: a binary file, not a printed log" in one_error_line(err)
    latin = write(tmp_path / "latin.log", "\n".join(["# entraînement: époque 1"] + iter_lines(range(50))) + "\n")
    latin.write_bytes(latin.read_text().encode("latin-1"))  # a few bytes that are not UTF-8 are still text
    assert diagnose.run(None, log=latin).last_step == 49


@pytest.mark.parametrize("first", ["llm.c", "nanoGPT"])
def test_llmc_and_nanogpt_lines_interleaved_say_the_log_mixes_formats(tmp_path, caplog, first):
    """40 llm.c lines learning, 60 nanoGPT lines at NaN: the nanoGPT ones are the most, whichever comes first."""
    llmc, nanogpt = cu_lines(range(40)), iter_lines(range(60), loss=lambda s: float("nan"))
    pairs = zip(llmc, nanogpt[:40]) if first == "llm.c" else zip(nanogpt[:40], llmc)
    lines = [line for pair in pairs for line in pair] + nanogpt[40:]
    with caplog.at_level(logging.WARNING):
        d = diagnose.run(None, log=write(tmp_path / "train.log", "\n".join(lines) + "\n"))
    assert d.verdict == "failed" and d.source.startswith("the nanoGPT log train.log")  # before: HEALTHY from llm.c's
    assert "(it mixes formats: 60 nanoGPT step lines read, 40 llm.c lines left out)" in d.source
    assert "mixes formats" in caplog.text


def test_main_log_followed_by_printed_lines_keeps_its_steps_and_says_so(tmp_path):
    main = [f"s:{s} trl:{healthy_loss(s / 10):.4f} lr:0.000300 norm:1.00" for s in range(2000)]
    out = tmp_path / "log124M"
    write(out / "main.log", "\n".join(main + cu_lines(range(100), total=100)) + "\n")
    d = diagnose.run(out)
    assert (d.first_step, d.last_step) == (0, 1999)  # before: steps 0-99, the printed ones, as 'its last run'
    assert d.source == ("main.log (it mixes formats: 2,000 llm.c main.log step lines read, 100 llm.c printed lines "
                        "left out)")


def test_llmc_lines_after_a_long_preamble_are_read_as_llmc(tmp_path):
    """The format is told from the first 400 lines; llm.c's lines after 600 of compiler output are still its."""
    d = diagnose.run(None, log=write(tmp_path / "train.log", "\n".join(["compiling..."] * 600 + cu_lines(range(40))) + "\n"))
    assert d.source == "the llm.c log train.log" and d.last_step == 39
