"""Every line of every fenced shell block in README.md is a command a newcomer can paste: our own
CLIs parse its arguments with their real parsers (parsing only, not the work), and the rest are
the few outside commands the README names."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
OUTSIDE = ("python3 -m venv ", "pip install ", "python -m pytest", "streamlit run app/main.py",
           "torchrun ", "jupyter lab notebooks/tour.ipynb")
PARSERS = {"train": "train.loop"}  # python -m X -> the module holding X's build_parser


def shell_lines() -> list[str]:
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", README.read_text(), re.S):
        joined = block.replace("\\\n", " ")
        lines += [line.strip() for line in joined.splitlines() if line.strip() and not line.startswith("#")]
    return lines


def test_the_readme_has_shell_blocks():
    assert len(shell_lines()) > 20


@pytest.mark.parametrize("line", shell_lines())
def test_each_readme_line_parses(line):
    assert not re.search(r"\s\[-{1,2}\w|\[[^\]]*\|[^\]]*\]", line), f"usage brackets in {line!r}"
    words = shlex.split(line, comments=True)
    if any(line.startswith(prefix) for prefix in OUTSIDE):
        return
    assert words[:2] == ["python", "-m"], f"not a command of this project: {line!r}"
    module = importlib.import_module(PARSERS.get(words[2], words[2]))
    argv = words[3:words.index(">")] if ">" in words else words[3:]
    module.build_parser().parse_args(argv)  # SystemExit (exit 2) on anything it does not accept
