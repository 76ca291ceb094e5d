"""Every probe's command line ends through one tail, `probes.cli.run_probe` (issue 61): its `main`
hands the parser and its reading to it, and prints no JSON, parses no arguments and sets no exit
code of its own. Read from the source (ast), so no model is loaded."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from probes.cli import Shown, show

PROBES = Path(__file__).resolve().parents[1] / "probes"
# what the tail does, so a main must not: print JSON, catch errors into exit codes, leave the process
TAIL_CALLS = {"dumps", "print_json", "run_cli", "exit", "parse_args"}


def cli_modules() -> list[Path]:
    """The modules holding a `python -m probes.<name>` main: each with a __main__ block (a package's
    __main__.py runs the main of its cli.py)."""
    found = []
    for path in sorted(PROBES.rglob("*.py")):
        text = path.read_text()
        if path.name == "__main__.py":
            found.append(path.with_name("cli.py"))
        elif 'if __name__ == "__main__":' in text and "def main(" in text:
            found.append(path)
    return found


def called_names(node: ast.AST) -> set[str]:
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def test_every_probe_cli_is_found():
    names = {p.relative_to(PROBES).as_posix() for p in cli_modules()}
    assert {"entropy.py", "logit_lens.py", "heads.py", "neighbours.py", "development.py", "diagnose.py",
            "sweep.py", "page_view.py", "ablate.py", "patching/cli.py"} <= names, names
    assert len(names) == 15, names


@pytest.mark.parametrize("path", cli_modules(), ids=lambda p: p.relative_to(PROBES).as_posix())
def test_main_ends_through_the_shared_tail(path: Path):
    tree = ast.parse(path.read_text())
    (main,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    calls = [c for c in ast.walk(main) if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "run_probe"]
    assert calls, f"{path.name}: main does not call probes.cli.run_probe"
    # main and the reading it hands over (a function of the module, or a lambda inside main)
    reading = calls[0].args[2]
    handed = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == getattr(reading, "id", None)]
    assert handed or isinstance(reading, ast.Lambda), f"{path.name}: run_probe's reading is not in the module"
    repeated = TAIL_CALLS & set().union(*(called_names(n) for n in [main, *handed]))
    assert not repeated, f"{path.name} repeats the tail: {sorted(repeated)}"


class Result:
    def to_dict(self):
        return {"x": float("nan")}

    def format(self):
        return "table"


def test_show_prints_json_or_table_then_warnings_and_returns_the_code(capsys):
    assert show(Result(), as_json=True) == 0
    assert capsys.readouterr().out == '{"x": null}\n'
    shown = Shown.of(Result(), lambda: "other table", warnings=["a", "b"], code=1)
    assert show(shown, as_json=False) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("other table\n", "warning: a\nwarning: b\n")
    assert show(None, as_json=True) == 0 and capsys.readouterr().out == ""
