"""Every line of every fenced shell block in README.md and the docs/ pages it links is a command a
newcomer can paste: our own CLIs parse its arguments with their real parsers (parsing only, not the
work), and the rest are the few outside commands the pages name."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
PAGES = [README, *sorted((README.parent / "docs").glob("*.md"))]  # the front page and one page a topic


def pages_text() -> str:
    return "\n".join(page.read_text() for page in PAGES)
OUTSIDE = ("python3 -m venv ", "pip install ", "python -m pytest", "streamlit run app/main.py",
           "torchrun ", "jupyter lab notebooks/tour.ipynb", "mkdir -p runs")
PARSERS = {"train": "train.loop", "probes.patching": "probes.patching.cli", "train.sweep": "train.sweep.cli"}  # python -m X -> the module holding X's build_parser


def shell_lines() -> list[str]:
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", pages_text(), re.S):
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


# ------------------------------------------------------------------ what pasting the README leaves behind

WRITE_FLAGS = re.compile(r"(?:--out|--save)\s+(\S+)|\s>\s*(\S+)")
PY_WRITES = re.compile(r"""(?:save_snapshot|save_pretrained|HFCallback)\(\s*"([^"]+)"|Monitor\([^"\n]*"([^"]+)\"""")


def written_paths() -> list[tuple[str, str]]:
    """(command, path) for what each README command writes: --out, --save, a shell redirection, a
    tuned lens trained (beside its snapshot unless --lens), and the paths the README's Python
    hands to save_snapshot, save_pretrained, Monitor and HFCallback."""
    from models.store.run import is_run_dir, latest_snapshot
    from probes.lens.tuned_file import lens_paths

    found = []
    for line in shell_lines():
        found += [(line, a or b) for a, b in WRITE_FLAGS.findall(line)]
        words = shlex.split(line, comments=True)
        if words[:3] == ["python", "-m", "probes.tuned_lens"] and "--steps" in words:
            if "--lens" in words:
                found.append((line, words[words.index("--lens") + 1]))
            else:
                ckpt = Path(words[words.index("--ckpt") + 1])
                snapshot = latest_snapshot(ckpt) if is_run_dir(ckpt) else ckpt
                found += [(line, str(p.relative_to(README.parent))) for p in lens_paths(README.parent / snapshot)]
    for block in re.findall(r"```python\n(.*?)```", pages_text(), re.S):
        found += [(block.strip().splitlines()[0], a or b) for a, b in PY_WRITES.findall(block)]
    return found


def test_the_readme_commands_leave_the_checkout_clean():
    """A newcomer who pastes the README ends with `git status` clean: whatever a command writes
    inside the checkout is git-ignored and not tracked (the tuned lens trained on the shipped GPT
    overwrote the tracked one; `--json > nn.json` left an untracked file at the root)."""
    import subprocess

    root = README.parent
    if subprocess.run(["git", "rev-parse"], cwd=root, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    paths = written_paths()
    assert len(paths) >= 8, paths
    for command, path in paths:
        if path.startswith(("../", "/")):  # outside the checkout (nanoGPT's, /tmp)
            continue
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=root).returncode == 0
        assert ignored, f"{command!r} writes {path}, which git does not ignore"
