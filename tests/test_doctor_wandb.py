"""The run doctor reads W&B runs (probes.doctor.read_wandb) written by the real wandb, offline:
nanoGPT's and nanochat's keys, the run's own step axis, resumed folders, damaged files."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from wandb_kit import offline_wandb, write_run

from probes import diagnose
from probes.doctor.run_history import RunHistory
from probes.doctor.wandb_file import Walk, fields, walk_wandb_records

DIVERGES_AT = 150  # the nanoGPT-keyed run's first NaN loss
BIG = "x" * 40_000  # a config value longer than a 32 KiB block: its record is cut in FIRST/MIDDLE/LAST chunks


def nanogpt_rows(first: int, last: int, offset: float = 0.0) -> list[dict]:
    """nanoGPT's wandb.log keys: iter, train/loss, val/loss, lr, mfu; NaN from DIVERGES_AT on."""
    rows = []
    for it in range(first, last):
        loss = math.nan if it >= DIVERGES_AT else 4.2 - 0.005 * it + offset
        rows.append({"iter": it, "train/loss": loss, "val/loss": loss + 0.05, "lr": 6e-4, "mfu": 1.5})
    return rows


def nanochat_rows(steps: int) -> list[dict]:
    """nanochat's base_train keys: a train row each step, a val/bpb row every 20 (two wandb.log
    calls at one step: W&B's _step runs ahead of nanochat's step)."""
    rows = []
    for s in range(steps + 1):
        if s % 20 == 0:
            rows.append({"step": s, "val/bpb": 1.6 - 0.004 * s})
        rows.append({"step": s, "train/loss": 2.0 + 2.2 * math.exp(-s / 25), "train/lrm": 1.0 - s / 120,
                     "train/dt": 0.1})
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wandb_runs")
    with offline_wandb(root) as wandb:
        found = {"nanogpt": write_run(wandb, nanogpt_rows(0, 200), {"learning_rate": 6e-4, "max_iters": 200,
                                                                    "block_size": 64, "blob": BIG}),
                 "nanochat": write_run(wandb, nanochat_rows(60), {"matrix_lr": 0.02, "num_iterations": 60}),
                 "first": write_run(wandb, nanogpt_rows(0, 100)),
                 "resume": write_run(wandb, nanogpt_rows(60, 140, offset=0.5))}
    # a resume under the same id writes a second folder, later in time: named so here
    run_id = found["first"].name.rsplit("-", 1)[1]
    later = found["first"].parent / f"offline-run-29991231_235959-{run_id}"
    found["resume"] = found["resume"].rename(later)
    return found


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = diagnose.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_our_framing_agrees_with_wandbs_own_protobuf(runs):
    """Every record our walk cuts out parses as wandb's Record, and its history items decode to
    the same keys and JSON values (the 40 KB config crosses blocks: FIRST, MIDDLE, LAST chunks)."""
    from wandb.proto import wandb_internal_pb2
    file = next(runs["nanogpt"].glob("run-*.wandb"))
    walk, rows = Walk(), 0
    for data in walk_wandb_records(file, walk):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.HasField("history"):
            rows += 1
            ours = [fields(item) for item in fields(fields(data)[2][0])[1]]
            theirs = [(".".join(i.nested_key) or i.key, i.value_json) for i in record.history.item]
            assert [(b".".join(o[2]).decode(), o[16][0].decode()) for o in ours] == theirs
        if record.HasField("run"):
            assert any(json.loads(i.value_json) == BIG for i in record.run.config.update)
    assert file.stat().st_size > 2 * 32 * 1024 and walk.damaged == 0 and walk.cut_at is None
    assert rows == 200


def test_a_nanogpt_keyed_run_that_diverges_fails_at_its_iter(runs, capsys):
    code, out, _ = cli(capsys, "--ckpt", str(runs["nanogpt"]))
    assert code == 0 and out.splitlines()[0].endswith("FAILED")
    d = diagnose.run(runs["nanogpt"])
    divergence = next(f for f in d.findings if f.code == "divergence")
    assert divergence.severity == "failed" and divergence.step == DIVERGES_AT
    h = RunHistory.read(runs["nanogpt"])
    assert [r["step"] for r in h.records] == list(range(200))  # iter, not _step (the same here)
    assert h.trainer == "nanogpt" and h.train_config("lr") == pytest.approx(6e-4) and h.model["n_ctx"] == 64


def test_a_nanochat_keyed_healthy_run_reads_healthy_on_its_own_steps(runs):
    d = diagnose.run(runs["nanochat"])
    assert d.verdict == "healthy", [(f.code, f.severity) for f in d.findings]
    h = RunHistory.read(runs["nanochat"])
    assert [r["step"] for r in h.records] == list(range(61))  # nanochat's step; W&B's _step reached 64
    bpb = {r["step"]: r["val_bpb"] for r in h.records if "val_bpb" in r}
    assert sorted(bpb) == [0, 20, 40, 60] and bpb[40] == pytest.approx(1.6 - 0.16, rel=1e-12)
    assert not any("val_loss" in r for r in h.records) and "val/bpb in bits per byte, not nats" in h.source
    at_30 = h.records[30]  # lr = matrix_lr x train/lrm, the Muon matrices' rate
    assert at_30["lr"] == pytest.approx(0.02 * (1 - 30 / 120), rel=1e-12)


def test_the_wandb_folder_reads_its_latest_run(runs, tmp_path):
    wandb_dir = tmp_path / "wandb"
    older, newer = (wandb_dir / f"offline-run-2026010{i}_000000-run{i}" for i in (1, 2))
    shutil.copytree(runs["nanogpt"], newer)
    shutil.copytree(runs["nanochat"], older)
    (wandb_dir / "latest-run").symlink_to(older.name)  # wandb's link to the run it wrote last
    assert RunHistory.read(wandb_dir).path == older
    (wandb_dir / "latest-run").unlink()  # no link: the newest folder by the time in its name
    assert RunHistory.read(wandb_dir).path == newer


def test_a_resumed_run_merges_by_step_the_later_folder_winning(runs):
    h = RunHistory.read(runs["first"])
    losses = dict(h.series("train_loss"))
    assert sorted(losses) == list(range(140)) and "2 resumed folders merged" in h.source
    assert losses[59] == pytest.approx(4.2 - 0.005 * 59, rel=1e-12)  # the first folder's
    assert losses[60] == pytest.approx(4.2 - 0.005 * 60 + 0.5, rel=1e-12)  # the resume's, redone


def test_a_run_folder_without_its_wandb_file_reads_the_summary_and_says_so(runs, tmp_path):
    folder = tmp_path / "wandb" / "run-20260101_000000-abc123"
    (folder / "files").mkdir(parents=True)
    (folder / "files" / "wandb-summary.json").write_text(json.dumps({"iter": 500, "train/loss": 1.5, "_step": 50}))
    (folder / "files" / "config.yaml").write_text("learning_rate:\n  desc: null\n  value: 0.001\n")
    h = RunHistory.read(folder)
    assert [(r["step"], r["train_loss"]) for r in h.records] == [(500, 1.5)]
    assert "wandb-summary.json only" in h.source and h.train_config("lr") == pytest.approx(1e-3)


def test_a_torn_file_reads_what_came_before_quietly(runs, tmp_path, caplog):
    folder = tmp_path / runs["nanochat"].name
    shutil.copytree(runs["nanochat"], folder)
    file = next(folder.glob("run-*.wandb"))
    whole = [r["step"] for r in RunHistory.read(runs["nanochat"]).records]
    data = file.read_bytes()
    file.write_bytes(data[:len(data) // 2])  # a run still writing, cut mid-record
    with caplog.at_level("WARNING"):
        steps = [r["step"] for r in RunHistory.read(folder).records]
    assert 0 < len(steps) < len(whole) and steps == whole[:len(steps)]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("content, says", [
    (b"", "an empty file"),
    (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "not a W&B run file"),
    ("future", "format version 1"),
])
def test_an_empty_garbage_or_future_file_is_one_line_exit_2(runs, tmp_path, capsys, content, says):
    folder = tmp_path / runs["nanochat"].name
    shutil.copytree(runs["nanochat"], folder)
    file = next(folder.glob("run-*.wandb"))
    if content == "future":
        data = bytearray(file.read_bytes())
        data[6] = 1  # the version byte after ':W&B' and the magic
        content = bytes(data)
    file.write_bytes(content)
    code, out, err = cli(capsys, "--ckpt", str(folder))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert says in err and file.name in err


def test_the_apps_run_list_reads_a_wandb_run_like_the_others(runs):
    from app import catalog, data
    row = catalog.summary(data.Source(runs["nanogpt"]))
    assert row["doctor"] == "failed" and row["steps"] == 199 and row["state"].startswith("diverged (the W&B run")
    assert catalog.typed(str(runs["nanochat"].parent), None)  # the wandb/ folder opens from "Open a path"


def test_a_damaged_block_costs_its_rest_counted_and_the_blocks_after_are_read(runs, tmp_path, capsys, caplog):
    folder = tmp_path / runs["nanogpt"].name
    shutil.copytree(runs["nanogpt"], folder)
    file = next(folder.glob("run-*.wandb"))
    data = bytearray(file.read_bytes())
    assert len(data) > 3 * 32 * 1024  # four blocks: the damage in the third
    data[2 * 32 * 1024 + 4000] ^= 0xFF
    file.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        h = RunHistory.read(folder)
    steps = [r["step"] for r in h.records]
    assert h.skipped == 1 and 0 < len(steps) < 200 and steps[-1] == 199  # the fourth block's rows read
    assert [r for r in caplog.records if "damaged block skipped" in r.message]
    code, out, _ = cli(capsys, "--ckpt", str(folder))
    assert code == 0 and "; 1 malformed record skipped)" in out.splitlines()[0]
