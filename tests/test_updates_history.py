"""g / w / u of a training run: its logged history, between two snapshots (with tokens: the SGD
identity), snapshots of different models refused, and the `python -m probes.updates` CLI.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import build_model, get_preset
from probes import updates

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def step_run(tmp_path_factory) -> Path:
    """A run logged and saved at every step, so snapshots and log can be compared."""
    from train.loop import main as train_main

    data = tmp_path_factory.mktemp("data") / "t.txt"
    data.write_text("the king and the queen shall not be what thou art.\n" * 60, encoding="utf-8")
    out = tmp_path_factory.mktemp("runs") / "r"
    assert train_main(["--preset", "transformer4_rms_small", "--data", str(data), "--out", str(out),
                       "-q", "--steps", "4", "--batch-size", "4", "--log-every", "1",
                       "--eval-every", "2", "--save-every", "1", "--optimizer", "sgd",
                       "--lr", "0.05", "--momentum", "0"]) == 0
    return out


def test_from_run_history_and_one_step(step_run):
    history = updates.from_run(step_run)
    assert history.steps == [1, 2, 3, 4]
    assert history.latest.step == 4 and history.at(2).step == 2
    rows = history.records()
    assert {r["step"] for r in rows} == {1, 2, 3, 4} and {"name", "group", "log10_u"} <= set(rows[0])
    assert len(history.group_records()) == 4 * len(history.latest.groups)
    with pytest.raises(ValueError, match="step 7 has no g/w/u record; logged steps: 1, 2, 3, 4"):
        updates.from_run(step_run, step=7)


def test_between_two_snapshots_equals_what_training_logged(step_run):
    logged = updates.from_run(step_run, step=3)
    offline = updates.between(step_run / "step_000002", step_run / "step_000003")
    assert set(offline.parameters) == set(logged.parameters)
    for name, row in offline.parameters.items():
        assert row["u"] == pytest.approx(logged.parameters[name]["u"], rel=1e-12), name
        assert row["w"] == pytest.approx(logged.parameters[name]["w"], rel=1e-12), name
    reverse = updates.between(step_run / "step_000003", step_run / "step_000002")
    assert reverse.parameters == offline.parameters  # the earlier snapshot is always `a`


def test_between_with_tokens_gives_g_and_the_sgd_identity(step_run):
    from models.checkpoint import load_checkpoint

    a = load_checkpoint(step_run / "step_000002")
    tokens = torch.tensor([a.tokenizer.encode("the king and the queen shall not be")])
    report = updates.between(a, step_run / "step_000003", tokens)
    assert report.lr == pytest.approx(0.05)
    for name, row in report.parameters.items():
        assert row["g"] is not None and row["g"] > 0, name


def test_between_refuses_snapshots_of_different_models(step_run, tmp_path):
    from models.checkpoint import save_snapshot
    from models.tokenizers import CharTokenizer

    other = tmp_path / "other"
    cfg = get_preset("transformer4_rms_small").replace(d_model=16, d_head=4)
    save_snapshot(other, build_model(cfg), CharTokenizer.from_text("abc"))
    with pytest.raises(ValueError, match="different models"):
        updates.between(step_run / "step_000001", other)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probes.updates", *args], capture_output=True,
                          text=True, cwd=REPO)


def test_cli_table_json_history_and_between(step_run):
    out = cli("--ckpt", str(step_run)).stdout
    assert out.startswith("g / w / u at step 4 (run)")
    assert re.search(r"^    blocks\.0\.attention\.heads\.0\.W_Q +g=\S+ w=\S+ u=\S+", out, re.M)
    assert "groups (median log10 u):" in out and "attention Q/K" in out
    data = json.loads(cli("--ckpt", str(step_run), "--step", "2", "--json").stdout)
    assert data["step"] == 2 and data == json.loads(json.dumps(updates.from_run(step_run, 2).to_dict()))
    hist = json.loads(cli("--ckpt", str(step_run), "--history", "--json").stdout)
    assert hist["steps"] == [1, 2, 3, 4]
    between = json.loads(cli("--ckpt", str(step_run), "--between", "1", "2", "--json").stdout)
    assert between["source"] == "between" and between["step"] == 2
    one = json.loads(cli("--ckpt", str(step_run / "step_000004"), "--text", "the king shall",
                         "--optimizer", "adam", "--lr", "0.001", "--json").stdout)
    assert one["source"] == "step" and one["lr"] == 0.001


def test_cli_bad_input_is_one_line_and_exit_2(step_run, tmp_path):
    empty = tmp_path / "empty_run"
    (empty / "step_000000").mkdir(parents=True)
    truncated = tmp_path / "truncated"
    import shutil

    shutil.copytree(step_run, truncated)
    with open(truncated / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "gwu": {"W_pos": {"g": 1')  # a crash mid-write
    cases = [(("--ckpt", str(empty)), "no metrics.jsonl records"),
             (("--ckpt", str(step_run), "--step", "9"), "step 9 has no g/w/u record"),
             (("--ckpt", str(step_run), "--band", "-2", "-4"), "band"),
             (("--ckpt", str(tmp_path / "missing")), "")]
    for args, message in cases:
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
        assert message in proc.stderr
    proc = cli("--ckpt", str(truncated), "--history", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["steps"] == [1, 2, 3, 4]
    assert "truncated last line" in proc.stderr
    proc = cli("--ckpt", str(step_run / "step_000004"), "--json")  # a snapshot: one step on its run's text
    assert proc.returncode == 0 and json.loads(proc.stdout)["text"].endswith("t.txt (the run's data)")
