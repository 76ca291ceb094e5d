"""The formats of issue 36 read by the doctor: llm.c's printed log (train_gpt2.cu's and train_gpt2.c's
printf lines) and its logger's main.log (llmc/logger.h), Lightning's TensorBoard tag names without
--tag, a Git LFS pointer named as such; and the Monitor hint in each trainer's words. The lines are
written here in those programs' printf formats, numbers chosen on paper."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from probes import diagnose
from probes.doctor.run_history import RunHistory
from test_doctor_logs import cli, nanogpt_text, one_error_line, write


def cu_line(step: int, steps: int, loss: float, norm: float, lr: float) -> str:
    """train_gpt2.cu: printf0("step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | ...")."""
    return (f"step {step:4d}/{steps} | loss {loss:7.6f} ({0.0:+.2f}z)| norm {norm:6.4f} ({0.0:+.2f}z)| lr {lr:.2e} "
            f"| {95.25:.2f} ms | {40.1:.1f}% bf16 MFU | {171234:.0f} tok/s")


def test_llmc_printed_lines_are_read_at_main_logs_zero_based_steps(tmp_path):
    lines = ["| learning rate (LR)    | 6.000000e-04                                       |",
             "| vocab_size V          | 50257                                              |",
             "val loss 11.000000", cu_line(1, 4, 10.9, 15.5, 3e-5), cu_line(2, 4, 9.5, 8.25, 6e-5),
             "val loss 9.000000", cu_line(3, 4, 8.75, 4.5, 9e-5), cu_line(4, 4, 8.5, 2.0, 1.2e-4), "val loss 8.000000"]
    h = RunHistory.read(None, log=write(tmp_path / "train.log", "\n".join(lines) + "\n"))
    assert h.source == "the llm.c log train.log" and h.trainer == "llmc"
    at = {r["step"]: r for r in h.records}
    assert sorted(at) == [0, 1, 2, 3, 4]  # "step 1/4" is step 0; the last val loss is step 4's
    assert at[0]["val_loss"] == 11.0 and at[0]["train_loss"] == 10.9 and at[0]["grad_norm"] == 15.5
    assert at[2]["val_loss"] == 9.0 and at[2]["lr"] == 9e-5 and at[4] == {"step": 4, "val_loss": 8.0}
    assert h.model["d_vocab"] == 50257 and h.train_config("lr") == 6e-4 and h.planned_steps == 4


def test_llmc_nan_from_the_start_fails_at_step_0(tmp_path):
    lines = ["val loss -nan"] + [cu_line(s, 8, math.nan, math.nan, 1e-4).replace("nan", "-nan", 1)
                                 for s in range(1, 9)]
    d = diagnose.run(None, log=write(tmp_path / "nan.log", "\n".join(lines) + "\n"))
    div = next(f for f in d.findings if f.code == "divergence")
    assert d.verdict == "failed" and div.step == 0 and "first step" in div.title


def test_llmc_main_log_in_its_output_folder(tmp_path):
    lines = ["s:0 tel:10.9876"] + [f"s:{s} trl:{10.9 - s / 100:.4f} lr:0.000600 norm:{1.0 + s / 1000:.2f}"
                                   for s in range(0, 200, 10)] + ["s:100 tel:9.9000", "s:100 eval:0.2950",
                                                                  "s:200 tel:9.0000"]
    write(tmp_path / "log124M" / "main.log", "\n".join(lines) + "\n")
    h = RunHistory.read(tmp_path / "log124M")
    at = {r["step"]: r for r in h.records}
    assert h.source == "main.log" and at[0] == {"step": 0, "val_loss": 10.9876, "train_loss": 10.9, "lr": 6e-4,
                                                 "grad_norm": 1.0}
    assert at[100]["val_loss"] == 9.9 and at[200] == {"step": 200, "val_loss": 9.0}  # eval: accuracy, not a loss
    old = write(tmp_path / "old" / "main.log", "s:0 trl:10.5000\ns:1 trl:10.2000\ns:1 tel:10.3000\n")  # older logger
    assert RunHistory.read(old.parent).records == [{"step": 0, "train_loss": 10.5},
                                                   {"step": 1, "train_loss": 10.2, "val_loss": 10.3}]


def test_train_gpt2_c_lines(tmp_path):
    lines = ["[GPT-2]", "vocab_size: 50257", "val loss 5.250000", "step 0: train loss 5.350000 (took 1452.121000 ms)",
             "step 1: train loss 4.250000 (took 1400.000000 ms)"]
    h = RunHistory.read(None, log=write(tmp_path / "c.log", "\n".join(lines) + "\n"))
    assert [(r["step"], r.get("val_loss"), r["train_loss"]) for r in h.records] == [(0, 5.25, 5.35), (1, None, 4.25)]


# ------------------------------------------------------------------ Lightning's tag names

def lightning_events(folder: Path, step_tag: bool = True, val_tag: str = "val_loss") -> Path:
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(str(folder))
    for step in range(40):
        if step_tag:
            w.add_scalar("train_loss_step", 4.0 - step / 20, step)
        w.add_scalar("lr-AdamW", 1e-3, step)
        if step % 10 == 9:
            w.add_scalar("train_loss_epoch", 9.0, step)  # an epoch mean, not read when per-step values exist
            w.add_scalar(val_tag, 4.1 - step / 20, step)
            w.add_scalar("epoch", step // 10, step)
    w.close()
    return folder


def test_lightning_tags_are_read_without_tag(tmp_path):
    pytest.importorskip("tensorboard")
    h = RunHistory.read(lightning_events(tmp_path / "a"))
    at = {r["step"]: r for r in h.records}
    assert at[9] == pytest.approx({"step": 9, "train_loss": 4.0 - 9 / 20, "lr": 1e-3, "val_loss": 4.1 - 9 / 20})
    assert h.trainer == "lightning" and len(h.records) == 40
    epochs = RunHistory.read(lightning_events(tmp_path / "b", step_tag=False, val_tag="valid_loss"))
    assert [r["train_loss"] for r in epochs.records if "train_loss" in r] == [9.0] * 4  # only epochs were logged
    assert all("val_loss" in r for r in epochs.records if "train_loss" in r)
    ptl = RunHistory.read(lightning_events(tmp_path / "c", val_tag="ptl/val_loss"))
    assert sum("val_loss" in r for r in ptl.records) == 4
    d = diagnose.run(tmp_path / "a")
    assert "in the LightningModule, train.monitor.Monitor(self, optimizer" in d.format()


# ------------------------------------------------------------------ LFS pointers and every error naming its file

POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize 1234\n".format("0" * 64)


@pytest.mark.parametrize("name", ["trainer_state.json", "train.log", "events.out.tfevents.1.host"])
def test_an_lfs_pointer_is_named_with_its_file(tmp_path, capsys, name):
    path = write(tmp_path / "repo" / name, POINTER)
    code, _, err = cli(capsys, "--log", str(path))
    assert code == 2 and one_error_line(err) == f"error: {path}: a Git LFS pointer, not the file: run git lfs pull"


# ------------------------------------------------------------------ advice and hints in each trainer's words

def test_nanogpt_clipping_advised_only_when_the_log_turned_it_off(tmp_path):
    def rising(step: int) -> float:
        return 2.0 + 2.2 * math.exp(-step / 60) + (math.exp((step - 120) / 12) - 1 if step > 120 else 0.0)
    text = nanogpt_text(rising).replace("Overriding: learning_rate = 0.5", "Overriding: learning_rate = 0.5\n"
                                        "Overriding: grad_clip = 0.0")
    d = diagnose.run(None, log=write(tmp_path / "off.log", text))
    assert "gradient clipping (it is off: --grad_clip=1.0)" in next(f for f in d.findings if f.code == "divergence").fix
    assert "three lines: monitor = Monitor(model, optimizer, 'runs/x')" in d.format()
