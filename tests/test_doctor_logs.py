"""The run doctor on nanoGPT's printed log (lines made by the f-strings of karpathy/nanoGPT's
train.py), found beside its ckpt.pt or named with --log; and the paths that are no history at all.
The Trainer's and TensorBoard's logs: tests/test_doctor_hf_tb.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from probes import diagnose
from probes.doctor.run_history import RunHistory

REPO = Path(__file__).resolve().parent.parent
SHIPPED_LOG = REPO / "docs" / "nanogpt_diverged.log"


def healthy_loss(step: int) -> float:
    return 2.0 + 2.2 * math.exp(-step / 60)


def diverging_loss(step: int, rise: int = 120, nan: int = 200) -> float:
    """Learns, then from `rise` climbs exponentially, and prints nan from `nan` on."""
    if step >= nan:
        return math.nan
    return healthy_loss(step) + (math.exp((step - rise) / 12) - 1 if step > rise else 0.0)


def nanogpt_text(loss, max_iters: int = 300, eval_interval: int = 50, log_interval: int = 10,
                 header: bool = True) -> str:
    """What `python train.py ... | tee train.log` prints, in nanoGPT's order: the configurator's
    echo, the set-up lines, then per iteration the eval line (every eval_interval) before the iter
    line (every log_interval). The eval's train loss differs a little from the iter's batch loss."""
    lines = []
    if header:
        lines += ["Overriding config with config/train_shakespeare_char.py:", "block_size = 256 # context",
                  f"max_iters = {max_iters}", "learning_rate = 1e-3 # with baby networks", "",
                  "Overriding: block_size = 64", "Overriding: learning_rate = 0.5"]
        tokens_per_iter = 16 * 64
        lines.append(f"tokens per iteration will be: {tokens_per_iter:,}")
        meta_vocab_size, meta_path = 65, "data/shakespeare_char/meta.pkl"
        lines.append(f"found vocab_size = {meta_vocab_size} (inside {meta_path})")
    running_mfu = -1.0
    for iter_num in range(max_iters + 1):
        if iter_num % eval_interval == 0:
            losses = {"train": loss(iter_num) - 0.01, "val": loss(iter_num) + 0.02}
            lines.append(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if iter_num % log_interval == 0:
            lossf, dt = loss(iter_num), 0.0125 + iter_num * 1e-6
            lines.append(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")
            running_mfu = 0.05
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = diagnose.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# ------------------------------------------------------------------ reading the printed log

def test_records_are_the_printed_numbers_the_eval_line_winning_its_step(tmp_path):
    log = write(tmp_path / "train.log", nanogpt_text(healthy_loss))
    h = RunHistory.read(None, log=log)
    steps = [r["step"] for r in h.records]
    assert steps == list(range(0, 301, 10)) and h.source == "the nanoGPT log train.log"
    at = {r["step"]: r for r in h.records}
    assert at[50]["train_loss"] == round(healthy_loss(50) - 0.01, 4)  # the eval line's, not the iter's
    assert at[50]["val_loss"] == round(healthy_loss(50) + 0.02, 4)
    assert at[60]["train_loss"] == round(healthy_loss(60), 4) and "val_loss" not in at[60]
    assert at[50]["step_time_ms"] == pytest.approx(12.55) and at[60]["tokens"] == 60 * 1024
    # the configurator's echo: the override wins; vocab and planned steps from their lines
    assert h.model == {"d_vocab": 65, "n_ctx": 64} and h.planned_steps == 300
    assert h.train_config("lr") == 0.5


def test_a_diverged_log_fails_at_its_first_nan_with_an_earlier_warning(tmp_path):
    log = write(tmp_path / "train.log", nanogpt_text(diverging_loss))
    d = diagnose.run(None, log=log)
    div = next(f for f in d.findings if f.code == "divergence")
    assert d.verdict == "failed" and div.severity == "failed"
    assert div.step == 200 and div.warning_step is not None and 120 < div.warning_step < 200
    # nanoGPT's lr; nanoGPT clips at grad_clip = 1.0 unless the log says otherwise: not advised again
    assert "(it is 0.5;" in div.fix and "clipping at 1 is already on" in div.fix and "--grad_clip" not in div.fix


def test_a_healthy_log_has_no_divergence_and_the_initial_loss_is_checked(tmp_path):
    d = diagnose.run(None, log=write(tmp_path / "train.log", nanogpt_text(healthy_loss)))
    assert d.verdict != "failed" and "divergence" not in {f.code for f in d.findings}
    assert "init_loss_high" not in d.not_checked  # step 0's eval and the vocab size: ln(65) checked


def test_step_cuts_before_the_nan(tmp_path):
    log = write(tmp_path / "train.log", nanogpt_text(diverging_loss))
    early = diagnose.run(None, step=150, log=log)
    assert early.last_step == 150 and early.upto == 150
    assert all(f.severity != "failed" for f in early.findings)


def test_internals_are_not_logged_and_the_monitor_is_named(tmp_path, capsys):
    log = write(tmp_path / "train.log", nanogpt_text(healthy_loss))
    d = diagnose.run(None, log=log)
    for code in ("attention_collapse", "attn_logit_growth", "update_ratio_high", "dead_units", "grad_spike"):
        assert d.not_checked[code].startswith("not logged: the nanoGPT log train.log has no ")
        assert "train.monitor.Monitor" in d.not_checked[code]
    code, out, _ = cli(capsys, "--log", str(log))
    assert code == 0 and "read from the nanoGPT log train.log" in out.splitlines()[0]
    assert out.count("train.monitor.Monitor") == 1  # said once under "not checked"


def test_a_truncated_last_line_is_skipped_and_the_rest_read(tmp_path, caplog):
    text = nanogpt_text(healthy_loss) + "step 310: train loss 2.0123, val loss 2.0"  # killed mid-print
    h = RunHistory.read(None, log=write(tmp_path / "train.log", text))
    assert h.last_step == 300 and "truncated last line" in caplog.text


def test_the_log_beside_ckpt_pt_is_found_by_itself(tmp_path, capsys):
    out_dir = tmp_path / "out-shakespeare-char"
    write(out_dir / "ckpt.pt", "never unpickled")  # the doctor only looks for the *.log beside it
    write(out_dir / "train.log", nanogpt_text(diverging_loss))
    for ckpt in (out_dir, out_dir / "ckpt.pt"):
        code, out, _ = cli(capsys, "--ckpt", str(ckpt), "--json")
        result = json.loads(out)
        assert code == 0 and result["source"] == "the nanoGPT log train.log" and result["verdict"] == "failed"
        assert result["run"] == str(out_dir / "train.log")


@pytest.mark.parametrize("text, problem", [
    ("compiling the model... (takes a ~minute)\nnumber of parameters: 0.10M\n", "no nanoGPT 'iter N"),
    ("", "an empty file: nothing was logged to it"),
    ("iter 0: loss 4.18", "no nanoGPT 'iter N"),  # its only line cut mid-print
])
def test_a_log_without_iter_or_step_lines_is_one_line_exit_2(tmp_path, capsys, text, problem):
    log = write(tmp_path / "train.log", text)
    code, out, err = cli(capsys, "--log", str(log))
    assert code == 2 and out == "" and problem in one_error_line(err) and str(log) in err


def test_tag_is_refused_for_a_nanogpt_log(tmp_path, capsys):
    log = write(tmp_path / "train.log", nanogpt_text(healthy_loss))
    code, _, err = cli(capsys, "--log", str(log), "--tag", "loss=train_loss")
    assert code == 2 and "not the lines of a nanoGPT log" in one_error_line(err)


# ------------------------------------------------------------------ what is no history

def test_a_folder_of_something_else_names_what_was_expected_and_found(tmp_path, capsys):
    write(tmp_path / "notes" / "readme.md", "hello")
    code, _, err = cli(capsys, "--ckpt", str(tmp_path / "notes"))
    line = one_error_line(err)
    assert code == 2 and "metrics.jsonl" in line and "trainer_state.json" in line and "--log" in line
    assert "readme.md" in line


def test_a_ckpt_pt_alone_asks_for_its_log(tmp_path, capsys):
    write(tmp_path / "out" / "ckpt.pt", "x")
    code, _, err = cli(capsys, "--ckpt", str(tmp_path / "out" / "ckpt.pt"))
    assert code == 2 and "--log FILE" in one_error_line(err)


def test_a_snapshot_outside_a_run_says_what_the_doctor_needs(tmp_path, capsys):
    snapshot = tmp_path / "exported"  # a snapshot copied out of its run
    write(snapshot / "config.json", json.dumps({"format_version": 1, "model": {}}))
    write(snapshot / "model.safetensors", "x")
    code, _, err = cli(capsys, "--ckpt", str(snapshot))
    line = one_error_line(err)
    assert code == 2 and "snapshot outside a run" in line and "train.monitor.Monitor" in line and "--log" in line


def test_neither_ckpt_nor_log_is_a_usage_error(capsys):
    code, _, err = cli(capsys)
    assert code == 2 and "--ckpt" in one_error_line(err)


def test_the_shipped_nanogpt_log_in_a_fresh_process_without_torch():
    """docs/nanogpt_diverged.log is the real output of nanoGPT's train.py at learning_rate=100:
    the doctor fails it at its first nan, warned earlier, and never imports torch doing so."""
    first_nan = next(int(line.split()[1].rstrip(":")) for line in SHIPPED_LOG.read_text().splitlines()
                     if line.startswith(("iter ", "step ")) and " nan" in line)
    code = ("import sys, json; from probes import diagnose; "
            f"d = diagnose.run(None, log={str(SHIPPED_LOG)!r}); "
            "print(json.dumps([d.verdict, d.findings[0].code, d.findings[0].step, d.findings[0].warning_step, "
            "'torch' in sys.modules, 'tensorboard' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    verdict, code_, step, warning, torch_loaded, tb_loaded = json.loads(out.stdout)
    assert (verdict, code_, step) == ("failed", "divergence", first_nan)
    assert warning < first_nan and not torch_loaded and not tb_loaded


@pytest.mark.parametrize("name, make, kind", [
    ("exported", lambda p: (write(p / "config.json", json.dumps({"format_version": 1, "model": {}})),
                            write(p / "model.safetensors", "x")), "a snapshot outside a run"),
    ("hf", lambda p: (write(p / "config.json", json.dumps({"model_type": "gpt2", "n_layer": 1})),
                      write(p / "model.safetensors", "x")), "a Hugging Face gpt2 model directory"),
    ("out/ckpt.pt", lambda p: write(p, "x"), "nanoGPT's checkpoint with no *.log beside it"),
    ("out", lambda p: write(p / "ckpt.pt", "x"), "nanoGPT's checkpoint with no *.log beside it"),
    ("model.pt", lambda p: write(p, "x"), "a .pt file")])
def test_weights_without_a_history_say_what_they_are_and_what_the_doctor_reads(tmp_path, capsys, name, make, kind):
    """A Hugging Face directory was 'a snapshot outside a run', a series .pt 'pass nanoGPT's
    printed log': each says what it is, then the histories the doctor reads, the Monitor's too."""
    make(tmp_path / name)
    code, _, err = cli(capsys, "--ckpt", str(tmp_path / name))
    line = one_error_line(err)
    assert code == 2 and f": {kind}, which holds weights but no training history;" in line
    for needed in ("metrics.jsonl", "train.monitor.Monitor", "trainer_state.json", "TensorBoard", "--log FILE"):
        assert needed in line, (needed, line)
