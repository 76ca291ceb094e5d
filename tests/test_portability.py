"""What a user who clones the repository gets: the data inside it, run.json files that name no
machine's directories, and the README's training example working on the shipped text."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from train.records import portable_argv, portable_path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "tinyshakespeare.txt"
TEXT_SUFFIXES = {".py", ".md", ".json", ".jsonl", ".toml", ".txt", ".ipynb", ".cfg", ""}


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    paths = [REPO / n for n in names.splitlines()]
    return [p for p in paths if p.is_file() and p.suffix in TEXT_SUFFIXES and p != DATA]


def machine_paths() -> list[str]:
    """Directories of this machine a shipped file must not name (built here, so this file does not
    name them itself): the checkout's parent (where the shared folder lives), the home and temp folders."""
    return [".." + "/shared", str(REPO.parent) + "/", str(Path.home()) + "/", "/" + "tmp/"]


def test_the_data_ships_with_the_repository():
    assert hashlib.md5(DATA.read_bytes()).hexdigest() == "6fb458f1232090904fb40fe944165e91"
    assert "tinyshakespeare.txt" in (REPO / "data" / "README.md").read_text()


def test_no_tracked_file_points_outside_the_repository():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    offenders = [f"{p.relative_to(REPO)}: {needle}" for p in tracked_text_files()
                 for needle in machine_paths() if needle in p.read_text(encoding="utf-8", errors="replace")
                 and p.name != "test_packaging.py"]  # asserts that a /tmp venv path is *absent*
    assert offenders == []


SHIPPED_RUNS = sorted(str(p.parent.relative_to(REPO / "checkpoints")) for p in (REPO / "checkpoints").glob("*/run.json")) \
    + sorted(str(p.parent.relative_to(REPO / "checkpoints")) for p in (REPO / "checkpoints").glob("*/*/run.json"))


def test_every_shipped_folder_is_a_run_or_a_sweep_of_runs():
    folders = sorted(p for p in (REPO / "checkpoints").iterdir() if p.is_dir())
    assert all((p / "run.json").exists() or (p / "sweep.json").exists() for p in folders)
    assert any("/" in run for run in SHIPPED_RUNS)  # the sweep's runs are checked below too


@pytest.mark.parametrize("sweep", sorted(p.parent.name for p in (REPO / "checkpoints").glob("*/sweep.json")))
def test_a_shipped_sweep_records_its_repository_folder(sweep):
    book = json.loads((REPO / "checkpoints" / sweep / "sweep.json").read_text())
    words = shlex.split(book["command"])
    assert words[:3] == ["python", "-m", "train.sweep"] and words[words.index("--out") + 1] == f"checkpoints/{sweep}"


@pytest.mark.parametrize("run", SHIPPED_RUNS)
def test_shipped_run_json_records_repository_paths(run):
    info = json.loads((REPO / "checkpoints" / run / "run.json").read_text())
    data = (REPO / info["data"]["path"]).resolve()
    if run == "induction":  # train.repetition: its own text, shipped beside it, and its own command
        assert data == (REPO / "checkpoints" / run / "data.txt").resolve()
        assert hashlib.sha256(data.read_bytes()).hexdigest() == info["data"]["sha256"]
        words = shlex.split(info["command"])
        assert words[:3] == ["python", "-m", "train.repetition"] and words[words.index("--out") + 1] == f"checkpoints/{run}"
        return
    assert data == DATA.resolve()
    argv = info["argv"]
    assert argv[argv.index("--out") + 1] == f"checkpoints/{run}"
    assert info["command"] == "python -m train " + shlex.join(argv)


def test_paths_inside_the_working_directory_are_recorded_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    inside, outside = tmp_path / "data" / "x.txt", Path("/opt/elsewhere/x.txt")
    assert portable_path(inside) == "data/x.txt" and portable_path(outside) == str(outside)
    assert portable_argv(["--data", str(inside), f"--out={tmp_path}/runs/a", "--steps", "3"]) == \
        ["--data", "data/x.txt", "--out=runs/a", "--steps", "3"]


@pytest.mark.slow
def test_the_readme_training_example_runs_on_the_shipped_text(tmp_path, monkeypatch):
    from train.loop import main

    readme = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    line = next(l for l in re.findall(r"^python -m train .*$", readme, re.M) if "--data" in l)
    argv = shlex.split(line)[3:]
    assert argv[argv.index("--data") + 1] == "data/tinyshakespeare.txt"
    argv[argv.index("--out") + 1] = str(tmp_path / "rms4")
    monkeypatch.chdir(REPO)  # the README's commands run from the repository root
    assert main([*argv, "-q", "--no-progress"]) == 0
    info = json.loads((tmp_path / "rms4" / "run.json").read_text())
    assert info["data"]["path"] == "data/tinyshakespeare.txt"
    assert info["data"]["sha256"] == hashlib.sha256(DATA.read_bytes()).hexdigest()
