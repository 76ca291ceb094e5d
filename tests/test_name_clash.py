"""A user's project beside scratchscope (issue 38, item 1): `from scratchscope import Monitor` from a
folder holding the user's own models.py, models/ package, probes.py or train.py. The script called
train.py gets the Monitor (nanoGPT's layout); a module of the user's that takes one of our package
names stops the import with one line naming that file and the way out, where it failed with
"No module named 'models.cli'; 'models' is not a package" from deep inside."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = "from scratchscope import Monitor\nprint('got', Monitor.__module__)\n"


def run_in(folder: Path, script: str = "script.py") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script], cwd=folder, capture_output=True, text=True, timeout=120)


def project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "script.py").write_text(SCRIPT)
    return tmp_path


@pytest.mark.parametrize("files,shown,name", [
    ({"models.py": "class GPT: ...\n"}, "models.py", "models"),
    ({"models/__init__.py": "", "models/gpt.py": "class GPT: ...\n"}, "models/ (a package)", "models"),
    ({"probes.py": "def probe(): ...\n"}, "probes.py", "probes"),
    ({"train.py": "", "models.py": "", "probes.py": ""}, "models.py", "models"),
], ids=["models.py", "models package", "probes.py", "all three"])
def test_a_clashing_module_is_one_line_naming_it_and_the_way_out(tmp_path, files, shown, name):
    done = run_in(project(tmp_path, files))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("scratchscope.NameClashError: scratchscope: your " + shown), last
    assert str(tmp_path) in last and f"rename yours (for example to my_{name})" in last, last
    assert "is not a package" not in done.stderr and "No module named" not in done.stderr


def test_a_script_called_train_py_gets_the_monitor(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    done = run_in(tmp_path, "train.py")
    assert done.returncode == 0 and done.stdout.strip() == "got train.monitor_core", done.stderr


def test_a_train_py_beside_another_script_is_left_alone_while_not_imported(tmp_path):
    done = run_in(project(tmp_path, {"train.py": "raise SystemExit('the user train.py was imported')\n"}))
    assert done.returncode == 0 and done.stdout.strip() == "got train.monitor_core", done.stderr


def test_the_users_own_train_module_imported_first_is_named(tmp_path):
    project(tmp_path, {"train.py": "STEPS = 10\n"})
    (tmp_path / "script.py").write_text("import train\n" + SCRIPT)
    done = run_in(tmp_path)
    assert done.returncode == 1 and "your train.py" in done.stderr.strip().splitlines()[-1], done.stderr
