"""The packaging, CI script and README agree with each other and with DESIGN.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pyproject() -> dict:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11+")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _requirements(pyproject: dict) -> dict[str, Requirement]:
    reqs = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    return {r.name.lower(): r for r in reqs}


def test_distribution_metadata(pyproject: dict) -> None:
    project = pyproject["project"]
    assert project["name"] == "scratchscope"
    assert project["version"] == "0.1.0"
    assert project["requires-python"] == ">=3.10"


def test_packages_models_probes_and_train(pyproject: dict) -> None:
    assert sorted(pyproject["tool"]["setuptools"]["packages"]) == [
        "models", "models.store", "probes", "probes.development_parts", "probes.doctor", "probes.lens", "probes.patching",
        "probes.rows", "probes.sources", "probes.sweep_parts", "probes.update_parts", "scratchscope", "train",
        "train.guard", "train.monitor", "train.sweep"]


def test_optional_parts_are_extras_that_dev_installs(pyproject: dict) -> None:
    extras = pyproject["project"]["optional-dependencies"]
    names = {extra: {Requirement(r).name.lower() for r in reqs} for extra, reqs in extras.items()}
    assert names["hf"] == {"transformers"} and names["tensorboard"] == {"tensorboard"}
    assert names["ray"] == {"ray"}  # python -m train.sweep --backend ray
    assert names["wandb"] == {"wandb"}  # the Monitor's W&B mirror (the doctor reads W&B runs without it)
    assert {"transformers", "tensorboard", "ray", "wandb"} <= names["dev"]
    assert not {"transformers", "tensorboard", "ray", "wandb"} & set(_requirements(pyproject))  # not for every user


def test_torch_has_no_upper_cap(pyproject: dict) -> None:
    torch = _requirements(pyproject)["torch"]
    assert not any(s.operator in ("<", "<=", "==", "===", "~=") for s in torch.specifier), str(torch)


def test_transformer_lens_range(pyproject: dict) -> None:
    tl = _requirements(pyproject)["transformer-lens"]
    assert sorted(str(s) for s in tl.specifier) == ["<5", ">=4.3"]


def test_runtime_and_dev_dependencies(pyproject: dict) -> None:
    runtime = set(_requirements(pyproject))
    assert {"einops", "numpy", "streamlit", "altair", "sentencepiece", "safetensors", "tqdm"} <= runtime
    dev = {Requirement(r).name.lower() for r in pyproject["project"]["optional-dependencies"]["dev"]}
    assert {"pytest", "hypothesis", "playwright", "pytest-timeout"} <= dev


def test_pytest_markers_declared(pyproject: dict) -> None:
    opts = pyproject["tool"]["pytest"]["ini_options"]
    names = {m.split(":")[0].strip() for m in opts["markers"]}
    assert {"slow", "browser"} <= names
    assert opts["testpaths"] == ["tests"]


def test_ci_run_is_executable_and_runs_pytest() -> None:
    script = ROOT / ".ci" / "run"
    assert os.access(script, os.X_OK), ".ci/run must be executable"
    text = script.read_text()
    assert "set -euo pipefail" in text
    assert "python -m pytest" in text
    assert "-m pytest" in text and '-eq 5' in text, "pytest's exit 5 (no tests) must fail CI"
    assert "/tmp/venv" not in text


def _code_blocks(markdown: str) -> list[list[str]]:
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)
    assert blocks, "README.md has no code block"
    return [[line.strip() for line in b.splitlines() if line.strip()] for b in blocks]


def test_readme_quick_start_commands() -> None:
    setup, main_job, tests = _code_blocks((ROOT / "README.md").read_text())[:3]
    assert setup[0].startswith("python3 -m venv .venv")
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup[1]  # the CPU choice first
    assert setup[-1] == 'pip install -e ".[dev]"'
    # the main job, then the tests in a block of their own (streamlit run does not return)
    assert main_job == ["streamlit run app/main.py"] and tests == ["python -m pytest"]
    assert 'pip install -e ".[dev]"' in (ROOT / ".ci" / "run").read_text()


# Imports run one way (DESIGN.md): train -> probes -> models. Each check runs in a fresh
# interpreter, since this test process has long since imported everything.
LAYER_CHECK = """
import sys, importlib, pkgutil
import {package}
for info in pkgutil.iter_modules({package}.__path__):
    if info.name not in ("__main__",):
        importlib.import_module("{package}." + info.name)
print(sorted({{m.split(".")[0] for m in sys.modules}} & {{"models", "probes", "train", "app"}}))
"""


@pytest.mark.parametrize("package, allowed", [
    ("models", ["models"]),
    ("probes", ["models", "probes"]),
    ("probes.doctor", ["models", "probes"]),
    ("probes.patching", ["models", "probes"]),
    ("probes.development_parts", ["probes"]),
    *[(f"probes.{part}", ["models", "probes"]) for part in ("lens", "rows", "sources", "sweep_parts", "update_parts")],
])
def test_imports_run_one_way(package: str, allowed: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", LAYER_CHECK.format(package=package)],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == str(allowed), f"importing all of {package}/ pulled in {out.strip()}"


def test_no_shim_modules_are_left() -> None:
    """One public import path per name (issue 38, item 11): the modules that only re-exported
    models.store (models.weights, models.series_ckpt, models.runs) or redirected training
    (models.train) are gone, and nothing imports them."""
    for shim in ("weights", "series_ckpt", "runs", "train"):
        assert not (ROOT / "models" / f"{shim}.py").exists(), shim
        proc = subprocess.run([sys.executable, "-c", f"import models.{shim}"], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 1 and "ModuleNotFoundError" in proc.stderr, shim