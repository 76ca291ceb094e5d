"""A user's project beside scratchscope (issue 38, item 1; issue 44): `from scratchscope import Monitor`
from a folder holding the user's own models.py, models/ package, probes.py, train.py or train/.

- a module of the user's that takes the name of our `models`, `probes` or a `train` package stops the
  import with one line (the whole of stderr) naming every such file at once, and the way out;
- a train.py of the user's is no clash: their `import train` (before or after) gets their module,
  and the Monitor, its modules loaded under `train.*`, never imports theirs;
- a folder of data with no Python file in it (models/ of checkpoints) is no module: accepted;
- a scratchscope.py of the user's hides the package itself: Python's own error names that file."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import scratchscope

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "from scratchscope import Monitor\nprint('got', Monitor.__module__)\n"


def run_in(folder: Path, script: str = "script.py") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script], cwd=folder, capture_output=True, text=True, timeout=120)


def project(tmp_path: Path, files: dict[str, str], script: str = SCRIPT) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "script.py").write_text(script)
    return tmp_path


@pytest.mark.parametrize("files,yours,renamed", [
    ({"models.py": "class GPT: ...\n"}, "models.py in {tmp} has the name of scratchscope's own `models` package",
     "my_models.py"),
    ({"models/__init__.py": "", "models/gpt.py": ""}, "models/ (a package) in {tmp} has the name", "my_models/"),
    ({"probes/gpt.py": ""}, "probes/ (a folder of Python files without __init__.py) in {tmp}", "my_probes/"),
    ({"train/__init__.py": "", "train/data.py": ""}, "train/ (a package) in {tmp} has the name of "
     "scratchscope's own `train` package", "my_train/"),
    ({"train.py": "", "models.py": "", "probes.py": ""}, "models.py and probes.py in {tmp} have the names of "
     "scratchscope's own `models` and `probes` packages", "my_models.py and my_probes.py"),
], ids=["models.py", "models package", "probes folder of code", "train package", "models.py and probes.py"])
def test_clashing_modules_are_one_line_naming_them_all_and_the_way_out(tmp_path, files, yours, renamed):
    done = run_in(project(tmp_path, files))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no traceback: the line the docs promise
    assert lines[0].startswith("scratchscope.NameClashError: scratchscope: your " + yours.format(tmp=tmp_path)), lines
    assert f"rename {'them' if ' and ' in renamed else 'it'} (for example to {renamed})" in lines[0], lines


def test_the_error_is_the_projects_own_exception_to_a_caller(tmp_path):
    script = ("try:\n    from scratchscope import Monitor\nexcept ImportError as err:\n"
              "    print(type(err).__module__, type(err).__name__)\n")
    done = run_in(project(tmp_path, {"models.py": ""}, script))
    assert done.returncode == 0 and done.stdout.split() == ["scratchscope", "NameClashError"], done


USER_TRAIN = """import os
if not os.environ.get("MONITOR_DONE"):
    raise SystemExit("the user's train.py was imported while the Monitor ran")
STEPS = 10
"""
def monitored_script(import_first: bool) -> str:
    """A user's loop beside their train.py: the Monitor measures internals, saves and diagnoses
    (each of which imports more of our modules), then the user's `import train`."""
    return (("import os\nos.environ['MONITOR_DONE'] = '1'\nimport train\nos.environ.pop('MONITOR_DONE')\n"
             if import_first else "") + """import os, sys
import torch
from scratchscope import Monitor
from models import TransformerConfig, build_model
torch.manual_seed(0)
model = build_model(TransformerConfig(d_vocab=11, n_ctx=8, d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
tokens = torch.randint(0, 11, (2, 8))
with Monitor(model, optimizer, sys.argv[1], log_every=1, eval_every=2, eval_tokens=tokens, save_every=2,
             diagnose_every=2, report=False) as monitor:
    for step in range(4):
        loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten())
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        monitor.log(step, train_loss=loss.item())
os.environ["MONITOR_DONE"] = "1"
import train
print("train is the user's:", train.STEPS, train.__file__)
import models, probes
print("ours:", models.__file__, probes.__file__)
""")


@pytest.mark.parametrize("import_first", [False, True], ids=["imported after", "imported before"])
def test_a_users_train_py_and_the_monitor_both_work_beside_data_folders(tmp_path, import_first):
    files = {"train.py": USER_TRAIN, "models/ckpt.bin": "weights", "probes/notes.txt": ""}  # data: no clash
    project(tmp_path, files, monitored_script(import_first))
    done = subprocess.run([sys.executable, "script.py", str(tmp_path / "run")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    *_, train, ours = done.stdout.strip().splitlines()
    assert train == f"train is the user's: 10 {tmp_path / 'train.py'}"
    assert ours == f"ours: {ROOT / 'models' / '__init__.py'} {ROOT / 'probes' / '__init__.py'}"
    assert (tmp_path / "run" / "metrics.jsonl").is_file() and any((tmp_path / "run").glob("step_*"))


def test_a_script_called_train_py_gets_the_monitor(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    done = run_in(tmp_path, "train.py")
    assert done.returncode == 0 and done.stdout.strip() == "got train.monitor.core", done.stderr


def test_a_users_scratchscope_py_is_named_by_pythons_own_error(tmp_path):
    done = run_in(project(tmp_path, {"scratchscope.py": "X = 1\n"}))
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot import name 'Monitor' from 'scratchscope'" in last and str(tmp_path / "scratchscope.py") in last


def train_imports(module: str) -> set[str]:
    """The `train.X` modules that `module`'s source imports, at its top or inside a function."""
    path = ROOT / module.replace(".", "/")
    tree = ast.parse((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("train."):
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module == "train":
            found.add("train")  # `from train import data` looks up whatever `train` names by then
        elif isinstance(node, ast.Import):
            found.update("train" for a in node.names if a.name == "train" or a.name.startswith("train."))
    return found


def closure(modules: tuple[str, ...]) -> set[str]:
    needed, todo = set(), list(modules)
    while todo:
        module = todo.pop()
        if module not in needed:
            needed.add(module)
            todo += train_imports(module) if module != "train" else []
    return needed


def test_every_train_module_the_monitor_imports_is_loaded_with_it():
    """What the Monitor imports later (inside a function) must be loaded while `train` names ours, each
    by its full name (a `from train import x` or `import train.x` looks `train` up: "train" below)."""
    assert closure(scratchscope.NEEDS["HFCallback"]) == set(scratchscope.NEEDS["HFCallback"])
    # train.monitor reaches train.monitor.hf only when asked for HFCallback, which loads it
    assert closure(scratchscope.NEEDS["Monitor"]) - {"train.monitor.hf"} == set(scratchscope.NEEDS["Monitor"])
