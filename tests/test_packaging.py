"""The packaging, CI script and README agree with each other and with DESIGN.md."""

from __future__ import annotations

import os
import re
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


def test_packages_models_and_probes(pyproject: dict) -> None:
    assert sorted(pyproject["tool"]["setuptools"]["packages"]) == ["models", "probes"]


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


def _first_code_block(markdown: str) -> list[str]:
    match = re.search(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M)
    assert match, "README.md has no code block"
    return [line.strip() for line in match.group(1).splitlines() if line.strip()]


def test_readme_quick_start_commands() -> None:
    commands = _first_code_block((ROOT / "README.md").read_text())
    assert len(commands) == 3, commands
    setup, main_job, tests = commands
    assert 'pip install -e ".[dev]"' in setup
    assert main_job.startswith("python -m ")
    assert tests == "python -m pytest"
