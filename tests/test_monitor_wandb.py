"""The Monitor mirrors its readings into the user's W&B run (train.monitor.wandb_mirror), written by the
real wandb offline and read back with our own reader: the user's rows untouched, ours under
scratchscope/ on the user's step key, the doctor's findings as alerts; and into a TensorBoard
SummaryWriter handed to it."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from nanogpt_ref import GPT, GPTConfig
from wandb_kit import offline_wandb

from models.checkpoint import read_metrics
from probes.doctor.read_wandb import MIRROR, MIRROR_STEP, read_segment
from probes.doctor.run_history import RunHistory
from probes.doctor.wandb_file import Walk, walk_wandb_records
from train.monitor import Monitor
from train.monitor.wandb_mirror import Mirror, mirror_for, readings

CONFIG = GPTConfig(block_size=8, vocab_size=17, n_layer=2, n_head=2, n_embd=16)
STEPS, NAN_FROM = 20, 15  # the user's loss is NaN from iter 15: the doctor's divergence, alerted
OWN = ("_step", "_runtime", "_timestamp")  # W&B's own keys, never the user's


def user_rows(step: int, loss: float) -> dict:
    return {"iter": step, "train/loss": loss, "lr": 0.01}  # nanoGPT's keys


def train(wandb, out: Path | None, writer=None) -> list[dict]:
    """A nanoGPT-style loop logging to W&B every iter (and, with `out`, a Monitor beside it, every 5:
    a record reaches the mirror when the next begins, and joins the user's next row);
    the user's rows as given to wandb.log."""
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.block_size + 1), generator=torch.Generator().manual_seed(0))
    run = wandb.init(project="scratchscope-tests", settings=wandb.Settings(console="off"))
    monitor = None if out is None else Monitor(model, optimizer, out, log_every=5, eval_every=10,
                                               eval_tokens=tokens[:, :-1], writer=writer)
    logged = []
    for it in range(STEPS):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())  # [batch pos vocab]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        lossf = math.nan if it >= NAN_FROM else loss.item()
        logged.append(user_rows(it, lossf))
        wandb.log(logged[-1])
        if monitor is not None:
            monitor.log(it, train_loss=lossf)
    if monitor is not None:
        monitor.close()
    run.finish()
    return logged


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("wandb_monitor")
    with offline_wandb(root) as wandb:
        train(wandb, None)  # the same loop without the Monitor
        plain_folder = (root / "wandb" / "latest-run").resolve()
        logged = train(wandb, root / "monitored")
        folder = (root / "wandb" / "latest-run").resolve()
        hf = train_hf(wandb, root / "hf")  # in the same wandb session: its core starts once
        styles = {style: (log_in_style(wandb, style, False), log_in_style(wandb, style, True)) for style in STYLES}
    assert folder != plain_folder
    return {"folder": folder, "plain": plain_folder, "logged": logged, "out": root / "monitored", "hf": hf,
            "hf_run": root / "hf" / "run", "styles": styles}


STYLES = {  # how users call wandb.log in their loop (it: their step), each a list of calls (row, kwargs)
    "step=": lambda it: [({"train/loss": 1 / (it + 1), "iter": it}, {"step": it})],
    "step= twice a step": lambda it: [({"train/loss": 1 / (it + 1), "iter": it}, {"step": it}),
                                      ({"val/loss": 2 / (it + 1)}, {"step": it})],  # after the Monitor's record
    "commit=False": lambda it: [({"iter": it, "train/loss": 1 / (it + 1)}, {"commit": False}), ({"lr": 0.01}, {})],
    "a step key": lambda it: [({"iter": it, "train/loss": 1 / (it + 1)}, {})],
    "none": lambda it: [({"train/loss": 1 / (it + 1)}, {})],
}


def log_in_style(wandb, style: str, mirrored: bool) -> Path:
    """Six iterations logged in `style`, with the Monitor's mirror recording after the user's first
    call of each (its grad_norm = the step) or without it; the run folder."""
    run = wandb.init(project="scratchscope-tests", settings=wandb.Settings(console="off"))
    mirror = mirror_for(None) if mirrored else None
    for it in range(6):
        calls = STYLES[style](it)
        for n, (row, kwargs) in enumerate(calls):
            wandb.log(row, **kwargs)
            if mirror is not None and n == 0:
                mirror.record({"step": it, "grad_norm": float(it)})
    run.finish()
    return Path(run.dir).parent


def train_hf(wandb, out: Path) -> Path | None:
    """report_to="wandb": the Trainer's WandbCallback calls wandb.init, HFCallback mirrors into that
    run; its folder (None without transformers)."""
    try:
        import transformers
    except ImportError:
        return None
    from train.monitor import HFCallback
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=17, n_positions=8, n_embd=16, n_layer=1, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    rows = torch.randint(0, 17, (16, 8), generator=torch.Generator().manual_seed(0))  # [example pos]
    args = transformers.TrainingArguments(output_dir=str(out / "hf"), use_cpu=True, report_to=["wandb"], max_steps=4,
                                          logging_steps=2, per_device_train_batch_size=4, save_strategy="no",
                                          disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                                   train_dataset=[{"input_ids": r, "labels": r} for r in rows],
                                   callbacks=[HFCallback(out / "run", log_every=2, report=False)])
    trainer.train()
    folder = Path(wandb.run.dir).parent
    wandb.run.finish()
    return folder


def raw_items(folder: Path) -> list[list[tuple[str, bytes]]]:
    """Each history row's (key, value JSON bytes), walked with our framing and read with wandb's protobuf."""
    from wandb.proto import wandb_internal_pb2
    rows, file = [], next(folder.glob("run-*.wandb"))
    for data in walk_wandb_records(file, Walk()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.HasField("history"):
            rows.append([(".".join(i.nested_key) or i.key, i.value_json.encode()) for i in record.history.item])
    return rows


def records_of(folder: Path, kind: str) -> list:
    from wandb.proto import wandb_internal_pb2
    found = []
    for data in walk_wandb_records(next(folder.glob("run-*.wandb")), Walk()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.HasField(kind):
            found.append(getattr(record, kind))
    return found


def users_rows(folder: Path) -> list[list[tuple[str, bytes]]]:
    """Each history row's keys and values of the user's own, W&B's bookkeeping and ours left out."""
    rows = [sorted((k, v) for k, v in row if k not in OWN and not k.startswith(MIRROR)) for row in raw_items(folder)]
    return [row for row in rows if row]


def test_the_users_rows_are_byte_for_byte_those_of_a_run_without_the_monitor(mirrored):
    theirs, without = users_rows(mirrored["folder"]), users_rows(mirrored["plain"])
    assert len(theirs) == len(mirrored["logged"]) == STEPS and theirs == without


@pytest.mark.parametrize("style", STYLES)
def test_in_any_logging_style_the_users_keys_are_never_written(mirrored, style):
    plain, folder = mirrored["styles"][style]
    assert users_rows(folder) == users_rows(plain) and len(users_rows(plain)) == 6  # every value, every row
    assert [dict(row)["_step"] for row in raw_items(folder) if any(k == "train/loss" for k, _ in row)] == \
        [dict(row)["_step"] for row in raw_items(plain) if any(k == "train/loss" for k, _ in row)]  # never advanced
    doctor = RunHistory.read(folder)  # ours read back at the Monitor's steps, whichever row they joined
    assert dict(doctor.series("grad_norm")) == {it: float(it) for it in range(6)}
    assert len(doctor.series("train_loss")) == 6


def test_our_readings_are_on_their_own_step_key_read_back_by_our_reader(mirrored):
    rows = read_segment(mirrored["folder"]).rows
    ours = {int(r[MIRROR_STEP]): {k: v for k, v in r.items() if k.startswith(MIRROR)} for r in rows
            if any(k.startswith(MIRROR) for k in r)}
    written = {r["step"]: readings(r) for r in read_metrics(mirrored["out"])}
    assert sorted(ours) == sorted(written) == [0, 5, 10, 15, STEPS - 1]  # the last step, recorded at close
    for step, values in written.items():
        assert values.keys() <= ours[step].keys()
        for key, value in values.items():  # a float through JSON and back: the same double
            assert ours[step][key] == pytest.approx(value, rel=1e-12, nan_ok=True), key
    assert {MIRROR + "update_log10_u/attention_q_k", MIRROR + "attn_entropy/layer_0",
            MIRROR + "attn_entropy/layer_1", MIRROR + "logit_max"} <= ours[10].keys()
    doctor = RunHistory.read(mirrored["folder"])  # the doctor reads the mirrored gradient norm too
    norms = {s: r[MIRROR + "grad_norm"] for s, r in written.items() if MIRROR + "grad_norm" in r}
    assert sorted(norms) == [0, 5, 10, 15]  # the last step's update is not measured (not a log step)
    assert dict(doctor.series("grad_norm")) == pytest.approx(norms)
    metrics = {m.name: m for m in records_of(mirrored["folder"], "metric")}
    keys = {k for values in ours.values() for k in values} - {MIRROR_STEP}
    assert keys <= metrics.keys() and all(metrics[k].step_metric == MIRROR_STEP for k in keys)
    assert not any("*" in name for name in metrics)  # exact names, never a glob


def test_the_doctors_findings_are_alerts_naming_their_step(mirrored):
    alerts = records_of(mirrored["folder"], "alert")
    divergence = [a for a in alerts if a.title == "scratchscope doctor: divergence"]
    assert len(divergence) == 1 and f"at step {NAN_FROM}" in divergence[0].text and divergence[0].level == "ERROR"
    summary = {i.key or ".".join(i.nested_key): json.loads(i.value_json)
               for s in records_of(mirrored["folder"], "summary") for i in s.update}
    assert summary.get(MIRROR + "verdict") == "failed"


class Writer:
    """What a SummaryWriter is asked to do, kept."""

    def __init__(self):
        self.scalars, self.texts, self.flushed = [], [], 0

    def add_scalar(self, tag, value, global_step=None):
        self.scalars.append((tag, value, global_step))

    def add_text(self, tag, text, global_step=None):
        self.texts.append((tag, text, global_step))

    def flush(self):
        self.flushed += 1


class FakeRun:
    def __init__(self, summary=None):
        self.summary, self.logged = summary or {"iter": 0, "train/loss": 1.0}, []

    def log(self, values, commit=True):
        self.logged.append(values if commit else ("commit=False", values))

    def define_metric(self, name, step_metric=None):
        pass

    def alert(self, title, text, level, wait_duration):
        self.logged.append(("alert", title, text, level))


def fake_wandb(monkeypatch, run: FakeRun):
    fake = type(sys)("wandb")
    fake.run, fake.patched = run, {"tensorboard": []}
    fake.AlertLevel = type("AlertLevel", (), {"WARN": "WARN", "ERROR": "ERROR"})
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return fake


def test_findings_once_a_code_and_each_rescue_are_alerts(monkeypatch):
    from probes.doctor.finding import Finding
    run = FakeRun()
    fake_wandb(monkeypatch, run)
    mirror = mirror_for(None)
    spike = Finding("grad_spike", "warning", "a grad norm 12x its median", 40, "", "clip", "")
    mirror.findings([spike, Finding("plateau", "info", "flat", 50, "", "", "")])
    mirror.findings([Finding("grad_spike", "warning", "again", 60, "", "clip", "")])  # the same code: said
    mirror.record({"step": 70, "train_loss": 9.0, "rescue": {"action": "rewind", "trigger": "loss spike",
                                                              "restored_step": 60, "lr_cap": 1e-3}})
    alerts = [a for a in run.logged if isinstance(a, tuple) and a[0] == "alert"]
    assert alerts == [("alert", "scratchscope doctor: grad_spike",
                       "[warning] grad_spike at step 40: a grad norm 12x its median; try: clip", "WARN"),
                      ("alert", "scratchscope guard: rewind", "the guard's rewind at step 70; trigger: loss spike; "
                       "back to step 60; learning rate capped at 0.001", "WARN")]
    assert [r for r in run.logged if r[0] == "commit=False"] == [("commit=False", {
        MIRROR_STEP: 70, MIRROR + "rescue": 1.0, MIRROR + "loss_above_best": 0.0})]


def test_with_tensorboard_synced_a_writers_values_reach_wandb_once(monkeypatch):
    fake = fake_wandb(monkeypatch, FakeRun())
    fake.patched = {"tensorboard": [{"root_logdir": "tb"}]}  # wandb.tensorboard.patch() was called
    writer = Writer()
    mirror = mirror_for(writer)
    mirror.record({"step": 5, "grad_norm": 0.5, "train_loss": 2.0})
    assert writer.scalars == [(MIRROR + "grad_norm", 0.5, 5), (MIRROR + "loss_above_best", 0.0, 5)]
    assert fake.run.logged == []  # W&B gets them through its TensorBoard sync: not a second time
    fake.patched = {"tensorboard": []}  # no sync: both, W&B's on our own step key
    mirror.record({"step": 10, "grad_norm": 0.25, "train_loss": 2.5})
    assert fake.run.logged == [("commit=False", {MIRROR_STEP: 10, MIRROR + "grad_norm": 0.25,
                                                 MIRROR + "loss_above_best": 0.5})]


@pytest.mark.parametrize("summary", [
    {"_step": 3, "iter": 30, "train/loss": 2.0}, {"_step": 3, "step": 30}, {"_step": 3, "loss": 2.0},
    {"_runtime": 0.1},  # the user has logged nothing yet: ours join their first row
])
def test_whatever_the_user_logged_ours_join_their_row_on_our_step_key(monkeypatch, summary):
    fake = fake_wandb(monkeypatch, FakeRun(summary))
    mirror_for(None).record({"step": 7, "grad_norm": 0.5})
    assert fake.run.logged == [("commit=False", {MIRROR_STEP: 7, MIRROR + "grad_norm": 0.5})]


def test_without_wandb_or_a_writer_there_is_no_mirror(monkeypatch):
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    assert mirror_for(None) is None
    with pytest.raises(ValueError, match="writer must be a TensorBoard SummaryWriter"):
        mirror_for("runs/tb")


def test_a_summary_writer_handed_to_the_monitor_holds_its_readings(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    from torch.utils.tensorboard import SummaryWriter
    from probes.doctor.read_tensorboard import read_scalars
    torch.manual_seed(0)
    model = GPT(CONFIG)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    writer = SummaryWriter(tmp_path / "tb")
    tokens = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.block_size + 1), generator=torch.Generator().manual_seed(1))
    with Monitor(model, optimizer, tmp_path / "run", log_every=2, eval_every=0, report=False, writer=writer) as monitor:
        for it in range(5):
            loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.log(it, train_loss=loss.item())
    writer.close()
    scalars, _ = read_scalars(tmp_path / "tb")
    norms = {r["step"]: r["grad_norm"] for r in read_metrics(tmp_path / "run")}
    got = dict(scalars[MIRROR + "grad_norm"])
    assert sorted(got) == sorted(norms) == [0, 2, 4]
    assert all(got[s] == pytest.approx(norms[s], rel=1e-6) for s in norms)  # TensorBoard keeps a float32


def test_a_failing_writer_stops_the_mirror_not_the_training(caplog):
    class Broken(Writer):
        def add_scalar(self, *args, **kwargs):
            raise OSError("disk full")
    mirror = Mirror(Broken())
    mirror.record({"step": 0, "grad_norm": 1.0})
    mirror.record({"step": 1, "grad_norm": 1.0})
    assert mirror.off and sum("stopped mirroring" in r.message for r in caplog.records) == 1



def test_the_trainers_callback_mirrors_into_the_run_its_wandb_callback_opened(mirrored):
    if mirrored["hf"] is None:
        pytest.skip("transformers is not installed (the dev extra installs it)")
    ours = {int(r[MIRROR_STEP]): r for r in read_segment(mirrored["hf"]).rows if MIRROR + "grad_norm" in r}
    norms = {r["step"]: r["grad_norm"] for r in read_metrics(mirrored["hf_run"]) if "gwu" in r}
    assert sorted(ours) == sorted(norms) == [2, 4]  # the Trainer's steps
    assert all(ours[s][MIRROR + "grad_norm"] == pytest.approx(norms[s], rel=1e-12) for s in norms)
    metrics = {m.name: m.step_metric for m in records_of(mirrored["hf"], "metric")}
    assert metrics[MIRROR + "grad_norm"] == MIRROR_STEP
    doctor = RunHistory.read(mirrored["hf"])  # the doctor reads the Trainer's W&B run on its own step key
    losses = {r["step"]: r["train_loss"] for r in read_metrics(mirrored["hf_run"]) if "train_loss" in r}
    assert doctor.trainer == "hf" and "steps: train/global_step" in doctor.source
    assert dict(doctor.series("train_loss")) == pytest.approx(losses) and sorted(losses) == [2, 4]
