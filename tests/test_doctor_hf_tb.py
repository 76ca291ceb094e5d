"""The run doctor on a Hugging Face Trainer's trainer_state.json (written by transformers'
own TrainerState) and on TensorBoard event files (written by PyTorch's SummaryWriter, as Trainer's
TensorBoardCallback and most loops do, and by tensorboard's own writer): records read, verdicts,
--step, --tag, and damaged files as one line and exit 2."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from probes import diagnose
from probes.doctor.run_history import RunHistory
from test_doctor_logs import cli, one_error_line

transformers = pytest.importorskip("transformers")
pytest.importorskip("tensorboard")

MAX_STEPS, LOG_EVERY, EVAL_EVERY = 100, 5, 20


def train_logs(diverge: bool) -> list[dict]:
    """What Trainer.log records over a run: a training entry every LOG_EVERY steps, an eval entry
    every EVAL_EVERY. Diverging, the loss climbs from step 40, the gradient norm grows a hundred-fold
    and goes NaN at step 70 (the Trainer's nan filter keeps the logged loss finite)."""
    entries = []
    for step in range(LOG_EVERY, MAX_STEPS + 1, LOG_EVERY):
        loss = 2.0 + 2.2 * math.exp(-step / 30)
        norm = 1.0
        if diverge and step > 40:
            loss += (step - 40) / 5
            norm = math.nan if step >= 70 else 10 ** ((step - 40) / 10)
        entries.append({"loss": loss, "grad_norm": norm, "learning_rate": 1e-3, "epoch": step / 50, "step": step})
        if step % EVAL_EVERY == 0:
            entries.append({"eval_loss": loss + 0.1, "eval_runtime": 0.5, "epoch": step / 50, "step": step})
    return entries


def logged_at(entries: list[dict], step: int) -> dict:
    """The entries of one step merged (a training and an eval entry)."""
    return {k: v for e in entries if e["step"] == step for k, v in e.items()}


def save_state(folder: Path, log_history: list[dict], global_step: int = MAX_STEPS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    state = transformers.TrainerState(max_steps=MAX_STEPS, global_step=global_step, logging_steps=LOG_EVERY,
                                      eval_steps=EVAL_EVERY, log_history=log_history)
    state.save_to_json(str(folder / "trainer_state.json"))
    return folder


def trainer_output(tmp_path: Path, diverge: bool = False) -> Path:
    """An output directory as Trainer leaves it: checkpoint-50/ and checkpoint-100/, each with its
    trainer_state.json and the model's config.json; the closing summary entry in the last one."""
    out = tmp_path / "hf-out"
    logs = train_logs(diverge)
    for step in (50, 100):
        folder = save_state(out / f"checkpoint-{step}", [e for e in logs if e["step"] <= step]
                            + ([{"train_loss": 9.9, "train_runtime": 3.0, "step": step}] if step == 100 else []),
                            global_step=step)
        config = transformers.GPT2Config(vocab_size=65, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                         bos_token_id=0, eos_token_id=0)
        config.to_json_file(str(folder / "config.json"))
    return out


# ------------------------------------------------------------------ Hugging Face Trainer

def test_trainer_state_of_the_newest_checkpoint_merged_per_step(tmp_path):
    h = RunHistory.read(trainer_output(tmp_path))
    assert h.path.parent.name == "checkpoint-100" and h.source == "trainer_state.json"
    assert [r["step"] for r in h.records] == list(range(LOG_EVERY, MAX_STEPS + 1, LOG_EVERY))
    at = {r["step"]: r for r in h.records}
    logged = logged_at(train_logs(False), 20)
    assert at[20]["train_loss"] == logged["loss"] and at[20]["val_loss"] == logged["eval_loss"]
    assert at[25]["lr"] == 1e-3 and at[25]["grad_norm"] == 1.0 and "val_loss" not in at[25]
    assert at[100]["train_loss"] != 9.9  # the closing summary's mean loss is not step 100's
    assert h.model == {"d_vocab": 65, "n_ctx": 32, "n_layers": 2, "n_heads": 2, "d_model": 16}
    assert h.planned_steps == MAX_STEPS


def test_a_trainer_run_whose_gradient_norm_goes_nan_fails_there(tmp_path, capsys):
    out = trainer_output(tmp_path, diverge=True)
    d = diagnose.run(out)
    div = next(f for f in d.findings if f.code == "divergence")
    assert d.verdict == "failed" and div.step == 70 and "grad norm" in div.where
    assert div.warning_step is not None and div.warning_step < 70
    # the Trainer clips at max_grad_norm=1.0 by default: not advised again, something else is
    assert "max_grad_norm" not in div.fix and "clipping at 1 is already on" in div.fix
    assert all(f.severity != "failed" for f in diagnose.run(out, step=65).findings)
    code, text, _ = cli(capsys, "--ckpt", str(out / "checkpoint-50"))  # a checkpoint folder itself
    assert code == 0 and "checkpoint-50" in text.splitlines()[0] and "read from trainer_state.json" in text


def test_a_healthy_trainer_run_and_what_it_did_not_log(tmp_path):
    d = diagnose.run(trainer_output(tmp_path))
    assert "divergence" not in {f.code for f in d.findings} and d.verdict != "failed"
    why = d.not_checked["attention_collapse"]
    assert why.startswith("not logged: trainer_state.json has no attention entropy") and "train.monitor.HFCallback" in why


@pytest.mark.parametrize("content, problem", [
    ('{"log_history": [{"loss": 2.0, "step": 5}', "not valid JSON"),  # truncated mid-write
    ('{"global_step": 10, "max_steps": 100}', "no log_history"),
    ('{"log_history": []}', "nothing logged yet"),
    ('{"log_history": [{"epoch": 1.0, "step": 5}]}', "no loss among its log_history keys (it has: epoch)"),
])
def test_a_damaged_trainer_state_is_one_line_exit_2(tmp_path, capsys, content, problem):
    (tmp_path / "trainer_state.json").write_text(content)
    code, out, err = cli(capsys, "--ckpt", str(tmp_path))
    line = one_error_line(err)
    assert code == 2 and out == "" and problem in line and "trainer_state.json" in line


# ------------------------------------------------------------------ TensorBoard

def write_events(folder: Path, tags: dict[str, str], diverge: bool = False) -> Path:
    """The same run through PyTorch's SummaryWriter, under `tags` ({ours: the tag written})."""
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(folder))
    for entry in train_logs(diverge):
        for key, ours in (("loss", "train_loss"), ("eval_loss", "val_loss"), ("learning_rate", "lr"),
                          ("grad_norm", "grad_norm")):
            if key in entry and ours in tags:
                writer.add_scalar(tags[ours], entry[key], entry["step"])
    writer.close()
    return folder


HF_TAGS = {"train_loss": "train/loss", "val_loss": "eval/loss", "lr": "train/learning_rate",
           "grad_norm": "train/grad_norm"}


def test_hf_style_events_under_runs_date_are_read_and_judged(tmp_path):
    out = tmp_path / "tb-out"
    write_events(out / "runs" / "Jan01_00-00-00_host", HF_TAGS, diverge=True)
    h = RunHistory.read(out)
    assert h.source == "the TensorBoard log" and h.path.name == "Jan01_00-00-00_host"
    at = {r["step"]: r for r in h.records}
    logged = logged_at(train_logs(True), 20)
    assert at[20]["train_loss"] == pytest.approx(logged["loss"], rel=1e-6)  # float32 in events
    assert at[20]["val_loss"] == pytest.approx(logged["eval_loss"], rel=1e-6)
    assert at[25]["lr"] == pytest.approx(1e-3) and math.isnan(at[70]["grad_norm"])
    d = diagnose.run(out)
    assert next(f for f in d.findings if f.code == "divergence").step == 70
    assert d.not_checked["dead_units"].startswith("not logged: the TensorBoard log has no activation health")


def test_healthy_events_from_tensorboards_own_writer(tmp_path):
    from tensorboard.summary import Writer  # tensor summaries, not the legacy scalar protos
    writer = Writer(str(tmp_path / "tb"))
    for entry in train_logs(False):
        if "loss" in entry:
            writer.add_scalar("loss", entry["loss"], step=entry["step"])
    writer.flush()
    d = diagnose.run(tmp_path / "tb")
    assert d.last_step == MAX_STEPS and "divergence" not in {f.code for f in d.findings}


def test_tag_maps_other_names_and_refuses_unknown_ones(tmp_path, capsys):
    folder = write_events(tmp_path / "tb", {"train_loss": "Loss/train", "val_loss": "Loss/val"}, diverge=True)
    code, _, err = cli(capsys, "--ckpt", str(folder))
    assert code == 2 and "(it has: Loss/train, Loss/val)" in one_error_line(err)
    code, out, _ = cli(capsys, "--ckpt", str(folder), "--tag", "Loss/train=train_loss", "--tag",
                       "Loss/val=val_loss", "--json")
    result = json.loads(out)
    assert code == 0 and result["source"] == "the TensorBoard log" and result["last_step"] == MAX_STEPS
    code, _, err = cli(capsys, "--ckpt", str(folder), "--tag", "Loss/train=training_loss")
    assert code == 2 and "'training_loss' is not a name the doctor reads" in one_error_line(err)
    assert "train_loss, val_loss" in err
    code, _, err = cli(capsys, "--ckpt", str(folder), "--tag", "Loss/tran=train_loss")
    assert code == 2 and "no TensorBoard tag 'Loss/tran'" in one_error_line(err) and "Loss/train" in err


def test_step_cut_on_events(tmp_path):
    folder = write_events(tmp_path / "tb", HF_TAGS, diverge=True)
    d = diagnose.run(folder, step=60)
    assert d.last_step == 60 and all(f.severity != "failed" for f in d.findings)


def test_a_truncated_event_file_reads_what_is_whole_or_says_one_line(tmp_path, capsys, caplog):
    folder = write_events(tmp_path / "tb", HF_TAGS)
    events = next(folder.glob("events.out.tfevents.*"))
    data = events.read_bytes()
    events.write_bytes(data[:-7])  # the last record cut: a run killed mid-write
    last = RunHistory.read(folder).records[-1]  # lost: the last scalar written, step 100's eval loss
    assert last["step"] == MAX_STEPS and "train_loss" in last and "val_loss" not in last
    assert "truncated record" in caplog.text
    events.write_bytes(data[:60])  # nothing whole after the file version record
    code, out, err = cli(capsys, "--ckpt", str(folder))
    assert code == 2 and out == "" and "truncated" in one_error_line(err) and events.name in err


def test_without_tensorboard_installed_the_error_says_what_to_install(tmp_path, capsys, monkeypatch):
    folder = write_events(tmp_path / "tb", HF_TAGS)
    for name in ("tensorboard", "tensorboard.compat.proto"):  # as if not installed
        monkeypatch.setitem(sys.modules, name, None)
    code, _, err = cli(capsys, "--ckpt", str(folder))
    assert code == 2 and "pip install 'scratchscope[tensorboard]'" in one_error_line(err)
