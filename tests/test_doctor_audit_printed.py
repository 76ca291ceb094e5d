"""Issue 37's audit of the doctor's readers of printed logs (nanoGPT's train.py output, llm.c's
printed log and main.log) and of paths that are no log: runs appended with `tee -a` told apart,
encodings (UTF-16 from PowerShell's tee, BOMs, CRLF), binary files, numbers too long to be steps,
FIFOs and devices, lines with no end. Each file is written here in tmp_path."""

from __future__ import annotations

import logging
import math
import os
import stat

import pytest

from probes import diagnose
from probes.doctor.run_history import RunHistory
from probes.doctor.text_log import MAX_LINE
from test_doctor_logs import cli, diverging_loss, healthy_loss, nanogpt_text, one_error_line, write


def run_text(lr: str, loss, max_iters: int = 300) -> str:
    return nanogpt_text(loss, max_iters=max_iters).replace("Overriding: learning_rate = 0.5",
                                                           f"Overriding: learning_rate = {lr}")


def blown_up(step: int) -> float:
    return math.nan if step >= 40 else healthy_loss(step) * (1 + step)


# ------------------------------------------------------------------ several runs in one log

def test_two_runs_appended_by_tee_a_diagnose_the_last_and_say_so(tmp_path, caplog):
    first = run_text("100", blown_up, max_iters=100)
    log = write(tmp_path / "train.log", first + run_text("1e-3", healthy_loss))
    with caplog.at_level(logging.WARNING):
        d = diagnose.run(None, log=log)
    # before: 'FAILED ... lower the learning rate (it is 0.001)' from the lr 100 run's NaN
    start = len(first.splitlines()) + 1
    assert d.verdict != "failed" and "divergence" not in {f.code for f in d.findings}
    assert d.source == f"the nanoGPT log train.log (its last run, from line {start}; 1 earlier run left out)"
    assert d.source in d.format().splitlines()[0] and "holds 2 runs" in caplog.text
    h = RunHistory.read(None, log=log)
    assert h.train_config("lr") == 1e-3 and h.first_step == 0 and h.last_step == 300


def test_the_last_of_three_runs_and_a_failed_last_run_still_fails(tmp_path):
    text = run_text("1e-3", healthy_loss, 100) + run_text("1e-3", healthy_loss, 100) + run_text("100", diverging_loss)
    d = diagnose.run(None, log=write(tmp_path / "train.log", text))
    assert d.verdict == "failed" and "2 earlier runs left out" in d.source
    assert next(f for f in d.findings if f.code == "divergence").step == 200


def test_a_counter_back_to_0_without_a_header_is_a_new_run(tmp_path):
    body = nanogpt_text(blown_up, max_iters=100, header=False) + nanogpt_text(healthy_loss, header=False)
    h = RunHistory.read(None, log=write(tmp_path / "train.log", body))
    assert "1 earlier run left out" in h.source and h.first_step == 0 and h.last_step == 300
    assert all(math.isfinite(r["train_loss"]) for r in h.records)


def test_a_resumed_run_continues_its_history_and_redoes_its_steps(tmp_path):
    """nanoGPT's init_from='resume' restarts at its checkpoint's step and says so: one run, whose
    steps from the resume point are the resumed run's."""
    first = run_text("1e-3", lambda s: healthy_loss(s) + 1.0, max_iters=200)
    resumed = [line for line in run_text("1e-3", healthy_loss).splitlines()
               if not any(line.startswith(p) for p in ("step ", "iter ")) or int(line.split()[1].rstrip(":")) >= 150]
    text = first + "Resuming training from out-shakespeare-char\n" + "\n".join(resumed) + "\n"
    h = RunHistory.read(None, log=write(tmp_path / "train.log", text))
    at = {r["step"]: r for r in h.records}
    assert h.source == "the nanoGPT log train.log" and h.first_step == 0 and h.last_step == 300
    assert at[140]["train_loss"] == round(healthy_loss(140) + 1.0, 4)  # before the resume: the first run's
    assert at[160]["train_loss"] == round(healthy_loss(160), 4)  # redone: the resumed run's


def test_a_resume_without_its_words_continues_when_it_starts_later(tmp_path):
    second = "\n".join(line for line in nanogpt_text(healthy_loss).splitlines()
                       if not line.startswith(("step ", "iter ")) or int(line.split()[1].rstrip(":")) >= 250)
    h = RunHistory.read(None, log=write(tmp_path / "train.log", nanogpt_text(healthy_loss, 200) + second + "\n"))
    assert h.source == "the nanoGPT log train.log" and h.first_step == 0 and h.last_step == 300


def cu_line(step: int, steps: int, loss: float) -> str:
    return (f"step {step:4d}/{steps} | loss {loss:7.6f} (+0.00z)| norm {1.0:6.4f} (+0.00z)| lr {3e-4:.2e} "
            f"| 95.25 ms | 40.1% bf16 MFU | 171234 tok/s")


def test_llmc_printed_runs_appended_diagnose_the_last(tmp_path):
    table = ["+-----------------------+----------------------------------------------------+",
             "| vocab_size V          | 50257                                              |"]
    bad = table + [cu_line(s, 40, math.nan if s > 5 else 10.0) for s in range(1, 41)]
    good = table + [cu_line(s, 40, 11.0 - s / 10) for s in range(1, 41)]
    d = diagnose.run(None, log=write(tmp_path / "train.log", "\n".join(bad + good) + "\n"))
    assert d.source == "the llm.c log train.log (its last run, from line 43; 1 earlier run left out)"
    assert "divergence" not in {f.code for f in d.findings} and d.last_step == 39


def test_llmc_main_log_restarted_at_step_0(tmp_path):
    lines = [f"s:{s} trl:{'nan' if s > 20 else '10.0'}" for s in range(0, 60)]
    lines += [f"s:{s} trl:{10.9 - s / 100:.4f}" for s in range(0, 60)]
    h = RunHistory.read(tmp_path, log=write(tmp_path / "main.log", "\n".join(lines) + "\n"))
    assert "1 earlier run left out" in h.source and all(math.isfinite(r["train_loss"]) for r in h.records)


# ------------------------------------------------------------------ numbers too long to be numbers

def test_a_5000_digit_iteration_number_is_skipped_and_said(tmp_path, caplog, capsys):
    huge = "9" * 5000
    text = nanogpt_text(healthy_loss) + f"iter {huge}: loss 2.0000, time 12.00ms, mfu 5.00%\n"
    with caplog.at_level(logging.WARNING):
        h = RunHistory.read(None, log=write(tmp_path / "train.log", text))
    # before: Python's 'Exceeds the limit (4300 digits) for integer string conversion'
    assert h.last_step == 300 and h.skipped == 1 and "step number is over 18 digits" in caplog.text
    only = write(tmp_path / "only.log", f"iter {huge}: loss 2.0000, time 12.00ms, mfu 5.00%\n")
    code, _, err = cli(capsys, "--log", str(only))
    line = one_error_line(err)
    assert code == 2 and "only.log" in line and "step number too long" in line and "4300" not in line


@pytest.mark.parametrize("setup", ["max_iters = " + "1" * 5000, "tokens per iteration will be: " + "1" * 5000,
                                   "found vocab_size = " + "7" * 5000 + " (inside meta.pkl)",
                                   "Overriding: learning_rate = " + "3" * 5000])
def test_a_5000_digit_setting_is_not_read_and_the_log_still_is(tmp_path, setup):
    text = setup + "\n" + nanogpt_text(healthy_loss, header=False)
    h = RunHistory.read(None, log=write(tmp_path / "train.log", text))
    assert h.last_step == 300 and h.planned_steps == 300 and "tokens" not in h.records[1]
    assert h.model.get("d_vocab") is None and h.train_config("lr") is None


def test_llmc_5000_digit_step_is_skipped(tmp_path):
    lines = [cu_line(s, 10, 11.0 - s / 10) for s in range(1, 11)] + [f"s:{'1' * 5000} trl:2.0"]
    h = RunHistory.read(None, log=write(tmp_path / "train.log", "\n".join(lines) + "\n"))
    assert h.last_step == 9 and h.skipped == 1


# ------------------------------------------------------------------ paths that are no regular file

def fifo(tmp_path, name: str = "train.log"):
    path = tmp_path / name
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("argv, words", [
    (lambda p: ["--log", str(fifo(p))], "a FIFO (named pipe), not a regular file"),
    (lambda p: ["--log", str(fifo(p, "trainer_state.json"))], "a FIFO (named pipe), not a regular file"),
    (lambda p: ["--log", str(fifo(p, "events.out.tfevents.1.host"))], "a FIFO (named pipe), not a regular file"),
    (lambda p: ["--ckpt", str(fifo(p))], "a FIFO (named pipe), not a regular file"),
    (lambda p: ["--log", "/dev/zero"], "/dev/zero: a character device, not a regular file"),
    (lambda p: ["--ckpt", "/dev/zero"], "/dev/zero: a character device, not a regular file"),
    (lambda p: ["--log", "/dev/null"], "/dev/null: a character device, not a regular file"),
])
def test_fifos_and_devices_are_named_as_such_without_blocking(tmp_path, capsys, no_hang, argv, words):
    code, out, err = cli(capsys, *argv(tmp_path))
    line = one_error_line(err)  # before: 'no such file' (--log), '[Errno 20] Not a directory' (--ckpt)
    assert code == 2 and out == "" and words in line and "no such file" not in line


def test_a_fifo_beside_a_nanogpt_checkpoint_is_not_taken_for_its_log(tmp_path, no_hang):
    write(tmp_path / "ckpt.pt", "x")
    fifo(tmp_path, "train.log")
    write(tmp_path / "real.log", nanogpt_text(healthy_loss))
    assert RunHistory.read(tmp_path).source == "the nanoGPT log real.log"


# ------------------------------------------------------------------ encodings and binary files

@pytest.mark.parametrize("encoding, bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-le", b""), ("utf-16-be", b"\xfe\xff"),
                                           ("utf-8", b"\xef\xbb\xbf"), ("utf-32-le", b"\xff\xfe\x00\x00")])
def test_a_log_in_utf16_or_with_a_bom_reads_as_in_utf8(tmp_path, encoding, bom):
    text = nanogpt_text(diverging_loss)
    reference = RunHistory.read(None, log=write(tmp_path / "utf8.log", text))
    path = tmp_path / "ps.log"
    path.write_bytes(bom + text.replace("\n", "\r\n").encode(encoding))  # PowerShell: CRLF too
    h = RunHistory.read(None, log=path)
    assert [r["step"] for r in h.records] == [r["step"] for r in reference.records]
    assert h.model == reference.model and h.train_config("lr") == 0.5
    assert diagnose.run(None, log=path).verdict == "failed"


def test_an_llmc_log_in_utf16_is_read_as_llmcs(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"\xff\xfe" + "\n".join(cu_line(s, 10, 11.0 - s / 10) for s in range(1, 11)).encode("utf-16-le")
                     + "\n".encode("utf-16-le"))
    h = RunHistory.read(None, log=path)
    assert h.trainer == "llmc" and h.last_step == 9


def test_a_binary_log_is_one_line_without_its_bytes(tmp_path, capsys):
    path = tmp_path / "train.log"
    path.write_bytes(bytes(range(256)) * 16)
    code, _, err = cli(capsys, "--log", str(path))
    line = one_error_line(err)
    assert code == 2 and "train.log: a binary file, not a printed log" in line and "\\x" not in line


def test_a_log_ending_in_binary_junk_warns_without_raw_bytes(tmp_path, caplog):
    path = write(tmp_path / "train.log", nanogpt_text(healthy_loss))
    path.write_bytes(path.read_bytes() + b"\x00\x01\x1b[2Kiter 3\x07\xff\xfe")  # a crash's NUL padding, no newline
    with caplog.at_level(logging.WARNING):
        h = RunHistory.read(None, log=path)
    assert h.last_step == 300 and "truncated last line" in caplog.text
    warned = next(r.getMessage() for r in caplog.records if "truncated" in r.getMessage())
    assert all(c.isprintable() for c in warned) and "\\x" not in warned


def test_invalid_utf8_bytes_in_a_text_log_are_replaced_not_fatal(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"caf\xe9 \xff\n" + nanogpt_text(healthy_loss).encode())
    assert RunHistory.read(None, log=path).last_step == 300


def test_a_file_with_no_line_breaks_is_skipped_in_pieces(tmp_path, caplog, capsys):
    path = write(tmp_path / "train.log", "x" * (3 * MAX_LINE) + "\n" + nanogpt_text(healthy_loss))
    with caplog.at_level(logging.WARNING):
        assert RunHistory.read(None, log=path).last_step == 300
    assert "skipped 1 line over" in caplog.text
    flat = write(tmp_path / "flat.log", "y" * (5 * MAX_LINE))
    code, _, err = cli(capsys, "--log", str(flat))
    assert code == 2 and "flat.log: no nanoGPT" in one_error_line(err)


def test_prefixed_and_crlf_lines_are_still_read(tmp_path):
    text = "".join(f"[rank0]: {line}\r\n" for line in nanogpt_text(healthy_loss).splitlines())
    assert RunHistory.read(None, log=write(tmp_path / "train.log", text)).last_step == 300


def test_an_empty_log_and_a_log_of_other_text_are_one_line(tmp_path, capsys):
    for name, text, said in (("empty.log", "", "an empty file"), ("other.log", "hello\nworld\n", "no nanoGPT")):
        code, _, err = cli(capsys, "--log", str(write(tmp_path / name, text)))
        assert code == 2 and name in one_error_line(err) and said in err


def test_a_symlink_to_a_log_is_read(tmp_path):
    real = write(tmp_path / "real.log", nanogpt_text(healthy_loss))
    (tmp_path / "link.log").symlink_to(real)
    assert RunHistory.read(None, log=tmp_path / "link.log").last_step == 300


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_log_says_so(tmp_path, capsys):
    path = write(tmp_path / "train.log", nanogpt_text(healthy_loss))
    path.chmod(0)
    code, _, err = cli(capsys, "--log", str(path))
    assert code == 2 and "Permission denied" in one_error_line(err)
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
