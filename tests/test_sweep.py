"""Learning-rate sweeps: the LR sensitivity and stable range on paper, a real tiny local sweep
whose sweep.json agrees with each run's own files (a diverging rate included), --resume, bad
input, and `python -m probes.sweep` reading it back. The Ray backend: tests/test_sweep_ray.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probes import diagnose, sweep as probe_sweep
from probes.sweep_parts.stats import lr_sensitivity, stable_range
from test_train import tiny_text
from train.sweep.cli import main

REPO = Path(__file__).resolve().parent.parent
RATES = (0.01, 0.1, 1e6)  # 1e6 diverges at the first step under SGD
GRID = ["--preset", "transformer4_small", "--set", "n_layers=1", "--optimizer", "sgd", "--steps", "8",
        "--batch-size", "8", "--log-every", "2", "--eval-every", "4", "--save-every", "0",
        "--lr", ",".join(map(str, RATES)), "--vary", "qk_norm=none,rms"]
LOSSES = ("train_loss", "val_loss")


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(tiny_text(), encoding="utf-8")
    return path


def sweep_args(text_file: Path, out: Path, *extra: str) -> list[str]:
    return [*GRID, "--data", str(text_file), "--out", str(out), "--workers", "2", *extra]


@pytest.fixture(scope="module")
def local_sweep(text_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sweeps") / "local"
    assert main(sweep_args(text_file, out)) == 0
    return out


def book(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ------------------------------------------------------------------ on paper


def test_lr_sensitivity_on_paper():
    """Wortsman et al.: mean over rates of min(loss, init) minus the best; a diverged run (None)
    counts as its init, a run that ended above its init counts as the init too."""
    # clipped: 3, 2, 4 (diverged), 2.5 -> mean 2.875, best 2
    assert lr_sensitivity([3.0, 2.0, None, 2.5], [4.0] * 4) == pytest.approx(0.875)
    # clipped: 4 (above init), 1, 4 -> mean 3, best 1
    assert lr_sensitivity([5.0, 1.0, math.nan], [4.0] * 3) == pytest.approx(2.0)
    assert lr_sensitivity([2.0, 2.0], [4.0, 4.0]) == 0.0  # every rate reached the best
    assert lr_sensitivity([None, None], [4.0, 3.0]) == pytest.approx(0.5)  # all diverged: the inits
    assert lr_sensitivity([2.0], [None]) is None and lr_sensitivity([], []) is None


def test_stable_range_on_paper():
    rates = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    assert stable_range(rates, [False] * 5) == {"lo": 1e-4, "hi": 1.0, "decades": pytest.approx(4), "rates": 5}
    # two runs of two: the wider in decades wins (1e-2..1 over 1e-4..1e-3 would tie on count)
    got = stable_range([1e-4, 1e-3, 3e-3, 1e-2, 1.0], [False, False, True, False, False])
    assert (got["lo"], got["hi"], got["rates"]) == (1e-2, 1.0, 2) and got["decades"] == pytest.approx(2)
    assert stable_range(rates, [True, False, False, False, True])["lo"] == 1e-3  # longest run
    assert stable_range(list(reversed(rates)), [True, False, False, False, False])["hi"] == 1e-1  # sorted first
    assert stable_range(rates, [True] * 5) is None
    assert stable_range([3e-4], [False]) == {"lo": 3e-4, "hi": 3e-4, "decades": 0.0, "rates": 1}


# ------------------------------------------------------------------ bad input


BAD = {
    "empty_rate": ["--lr", "1e-3,,1e-2"],
    "non_positive_rate": ["--lr", "1e-3,0"],
    "negative_rate": ["--lr", "1e-3,-1"],
    "duplicate_rate": ["--lr", "1e-3,0.001"],
    "unknown_vary": ["--lr", "1e-3", "--vary", "colour=red,blue"],
    "duplicate_vary_value": ["--lr", "1e-3", "--vary", "qk_norm=rms,rms"],
    "vary_value_the_model_refuses": ["--lr", "1e-3", "--vary", "qk_norm=none,batch"],
    "vary_value_the_trainer_refuses": ["--lr", "1e-3", "--vary", "z_loss=0,lots"],
    "vary_and_fixed": ["--lr", "1e-3", "--vary", "z_loss=0,1e-4", "--z-loss", "1e-3"],
    "unknown_train_flag": ["--lr", "1e-3", "--colour", "red"],
    "unknown_preset": ["--lr", "1e-3", "--preset", "nope"],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(case, text_file, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--preset", "transformer4_small", "--data", str(text_file), "--out", str(out), *BAD[case]]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert not out.exists()
    if case == "unknown_vary":
        assert "qk_norm" in line and "z_loss" in line  # it names the known fields


@pytest.mark.slow
def test_a_folder_holding_a_sweep_is_refused_without_resume(local_sweep, text_file, tmp_path, capsys):
    before = tree_digest(local_sweep)
    assert main(sweep_args(text_file, local_sweep)) == 2
    assert "--resume" in one_error_line(capsys)
    assert main([*GRID, "--steps", "9", "--data", str(text_file), "--out", str(local_sweep), "--resume"]) == 2
    assert "another grid" in one_error_line(capsys)
    assert main(["--out", str(tmp_path), "--resume"]) == 2  # nothing to resume
    assert "no sweep.json" in one_error_line(capsys)
    assert tree_digest(local_sweep) == before


# ------------------------------------------------------------------ a real sweep


def first_nonfinite(recs: list[dict]) -> int | None:
    return next((r["step"] for r in recs if r.get("diverged")
                 or any(k in r and not isinstance(r[k], float) for k in LOSSES)), None)


@pytest.mark.slow
def test_sweep_json_is_what_each_run_wrote(local_sweep):
    data = book(local_sweep)
    assert data["status"] == "finished" and data["grid"]["rates"] == list(RATES)
    assert len(data["runs"]) == 6 and {r["variant"] for r in data["runs"]} == {"qk_norm=none", "qk_norm=rms"}
    for run in data["runs"]:
        run_dir = local_sweep / run["dir"]
        recs = records(run_dir)
        val = [(r["step"], r["val_loss"]) for r in recs if "val_loss" in r]
        finite = [v for _, v in val if isinstance(v, float)]
        assert run["name"] == run_dir.name and run["log"] and (local_sweep / run["log"]).is_file()
        assert run["init_val_loss"] == val[0][1] and val[0][0] == 0
        assert run["best_val_loss"] == min(finite)
        assert run["diverged_at"] == first_nonfinite(recs)
        found = diagnose.run(run_dir)
        assert run["verdict"] == found.verdict
        assert run["findings"] == list(dict.fromkeys(f.code for f in found.findings))
        assert run["status"] == "finished" and run["steps"] == 8
        if run["lr"] == 1e6:  # diverged at its first record: SGD at 1e6
            assert run["diverged_at"] == recs[-1]["step"] == 2 and run["exit_code"] == 3
            assert run["final_val_loss"] is None and run["verdict"] == "failed" and "divergence" in run["findings"]
        else:
            assert run["final_val_loss"] == recs[-1]["val_loss"] and recs[-1]["step"] == 8
            assert run["exit_code"] == 0 and run["diverged_at"] is None
        assert json.loads((run_dir / "run.json").read_text())["train"]["lr"] == run["lr"]


@pytest.mark.slow
def test_variants_summarise_their_runs(local_sweep):
    data = book(local_sweep)
    for variant in data["variants"]:
        runs = sorted((r for r in data["runs"] if r["variant"] == variant["name"]), key=lambda r: r["lr"])
        clipped = [r["init_val_loss"] if r["diverged_at"] is not None else min(r["final_val_loss"], r["init_val_loss"])
                   for r in runs]
        assert variant["lr_sensitivity"] == pytest.approx(sum(clipped) / 3 - min(clipped), rel=1e-12)
        assert variant["stable_range"] == {"lo": 0.01, "hi": 0.1, "decades": pytest.approx(1.0), "rates": 2}
        assert variant["complete"] and variant["diverged"] == 1
        assert variant["values"] == {"qk_norm": variant["name"].split("=")[1]}


@pytest.mark.slow
def test_resume_keeps_finished_runs_and_restarts_an_unfinished_one(local_sweep, text_file, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(local_sweep, out)
    cut = out / "lr=1e-01,qk_norm=rms"  # as if killed at step 4: its last records and snapshot gone
    (cut / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(cut)[:3]))
    shutil.rmtree(cut / "step_000008")
    kept = {p.name: tree_digest(p) for p in out.iterdir() if p.is_dir() and p != cut and p.name != "logs"}
    assert main(["--out", str(out), "--resume", "--workers", "2"]) == 0
    assert {name: tree_digest(out / name) for name in kept} == kept  # untouched
    again = {r["name"]: r for r in book(out)["runs"]}
    first = {r["name"]: r for r in book(local_sweep)["runs"]}
    assert records(cut)[-1]["step"] == 8 and again[cut.name]["status"] == "finished"
    assert again[cut.name]["final_val_loss"] == pytest.approx(first[cut.name]["final_val_loss"], rel=1e-5)
    assert all(r["status"] == "finished" for r in again.values())
    assert book(out)["command"] == book(local_sweep)["command"]  # how it started; the resume is listed
    assert book(out)["resumes"][0]["command"] == f"python -m train.sweep --out {out} --resume --workers 2"


@pytest.mark.slow
def test_ctrl_c_stops_the_runs_and_says_what_finished(text_file, tmp_path):
    out = tmp_path / "long"
    argv = [*sweep_args(text_file, out)[:-2], "--workers", "1", "--steps", "100000", "--log-every", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "train.sweep", *argv], cwd=REPO, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    first = out / "lr=1e-02,qk_norm=none" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (first.is_file() and len(first.read_text().splitlines()) > 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1].startswith("interrupted: 0 of 6 runs finished")
    data = book(out)
    assert data["status"] == "interrupted"
    assert [r["status"] for r in data["runs"]].count("interrupted") == 1
    assert not (first.parent / ".train.lock").exists()  # the run stopped and let go of its lock


# ------------------------------------------------------------------ probes.sweep


def test_a_blown_up_final_loss_keeps_the_tables_column_width():
    assert probe_sweep.loss_text(2.11156) == "2.112" and probe_sweep.loss_text(99.9994) == "99.999"
    assert probe_sweep.loss_text(535.851) == "5.4e+02" and probe_sweep.loss_text(116104.012) == "1.2e+05"
    cells = [probe_sweep.cell_text({"status": "finished", "final_val_loss": v, "diverged_at": 50, "verdict": "failed"})
             for v in (2.1, 535.9, 1.2e5, 2.4e7)]
    assert len({len(c) for c in cells}) == 1, cells  # one width: the next variant's column lines up


@pytest.mark.slow
def test_probes_sweep_prints_the_table_and_json(local_sweep, capsys):
    assert probe_sweep.main(["--ckpt", str(local_sweep)]) == 0
    text = capsys.readouterr().out
    assert "6 of 6 runs finished" in text and "qk_norm=none" in text and "qk_norm=rms" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line[:2] in ("1e", "lr")}
    assert set(rows) == {"lr", "1e-02", "1e-01", "1e+06"}
    assert rows["1e+06"].count("step 2") == 2 and rows["1e+06"].count("failed") == 2
    assert "1e-02..1e-01 (1.0 decades)" in text
    assert probe_sweep.main(["--ckpt", str(local_sweep), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"sweep": str(local_sweep), **book(local_sweep)}


def test_probes_sweep_on_a_folder_that_is_no_sweep(tmp_path, capsys):
    assert probe_sweep.main(["--ckpt", str(tmp_path)]) == 2
    assert "no sweep" in one_error_line(capsys)
    (tmp_path / "sweep.json").write_text("{}")
    assert probe_sweep.main(["--ckpt", str(tmp_path)]) == 2
    one_error_line(capsys)


@pytest.mark.slow
def test_probes_sweep_is_torch_free(local_sweep):
    code = ("import sys; from probes import sweep; sweep.main(['--ckpt', sys.argv[1]]); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(local_sweep)], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


# ------------------------------------------------------------------ the Ray backend

SAME = ("status", "exit_code", "steps", "last_step", "diverged_at", "diverged_by", "verdict", "findings")
CLOSE = ("init_val_loss", "final_val_loss", "best_val_loss")


def assert_same_runs(got: dict, want: dict) -> None:
    """Two sweeps of one grid agree run by run (losses to float rounding) and per variant."""
    assert [r["name"] for r in got["runs"]] == [r["name"] for r in want["runs"]]
    for a, b in zip(got["runs"], want["runs"]):
        assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}, a["name"]
        assert [a[k] is None for k in CLOSE] == [b[k] is None for k in CLOSE], a["name"]
        assert [a[k] for k in CLOSE if a[k] is not None] == pytest.approx(
            [b[k] for k in CLOSE if b[k] is not None], rel=1e-5), a["name"]
    for a, b in zip(got["variants"], want["variants"]):
        assert a["stable_range"] == b["stable_range"] and a["lr_sensitivity"] == pytest.approx(b["lr_sensitivity"], rel=1e-5)


def val_losses(recs: list[dict]) -> list[float]:
    return [r["val_loss"] for r in recs if "val_loss" in r]


def point_spec(local_sweep: Path, name: str, **spec) -> dict:
    from train.sweep.grid import Grid

    grid = Grid.from_dict(book(local_sweep)["grid"])
    point = next(p for p in grid.points() if p.name == name)
    return {"name": name, "argv": grid.argv(point), "out": name, "log": "x.log", "storage": "auto", **spec}


@pytest.mark.slow
def test_a_task_that_cannot_see_the_sweep_sends_its_run_back(local_sweep, text_file, tmp_path):
    """A Ray task on a node without SWEEP_DIR trains in a temporary folder from the shipped data
    and returns the run as bytes, which unpack into the same run the local backend trained."""
    from train.sweep.on_ray import sees_sweep, train_task, unpack

    name = "lr=1e-01,qk_norm=rms"
    here = point_spec(local_sweep, name, id=book(local_sweep)["id"], cwd="/", sweep_dir=str(local_sweep),
                      data=str(text_file))
    assert sees_sweep(here) and not sees_sweep({**here, "id": "another sweep"})
    elsewhere = point_spec(local_sweep, name, id="x", cwd=str(tmp_path), sweep_dir="absent", data="data/t.txt")
    result = train_task(elsewhere, text_file.read_bytes())
    assert result["code"] == 0 and not result["shared"] and b"training finished" in result["log"]
    assert not (tmp_path / name).exists()  # trained in a temporary folder, not in the task's cwd
    unpack(result["run"], tmp_path / "back" / name)
    got, want = records(tmp_path / "back" / name), records(local_sweep / name)
    assert val_losses(got) == pytest.approx(val_losses(want), rel=1e-5)
    assert json.loads((tmp_path / "back" / name / "run.json").read_text())["data"]["path"] == "data/t.txt"


@pytest.mark.slow
def test_ray_backend_gives_the_local_backends_sweep(local_sweep, text_file, tmp_path):
    ray = pytest.importorskip("ray")  # the ray extra; CI installs it with dev
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    try:
        out = tmp_path / "ray"
        assert main(sweep_args(text_file, out, "--backend", "ray")) == 0
        assert ray.is_initialized()  # the sweep used the driver's Ray and left it running
    finally:
        ray.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    data = book(out)
    assert data["backend"] == "ray" and data["status"] == "finished"
    assert_same_runs(data, book(local_sweep))
    assert {p.name for p in out.iterdir()} == {p.name for p in local_sweep.iterdir()}
