"""The end every probe's command line shares, in one place: `python -m probes.<name>` parses its
arguments, reads what it measures, and shows it here: JSON on stdout with --json, its table
otherwise, each warning as a `warning: ...` line on stderr after that, and the exit code. Bad input
(any ValueError or OSError) is one line on stderr and exit 2, Ctrl-C one line and 130
(`models.cli.run_cli`).

    def main(argv: list[str] | None = None) -> int:
        return run_probe(build_parser, argv, from_args)  # from_args(args) -> a result, a Shown or None

A result (anything with `to_dict()`, the --json output, and `format()`, the table) is shown as it
is; a `Shown` says what else to print: another table, warnings, an exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from models.cli import run_cli, to_jsonable


def json_line(data: Any) -> str:
    """The probes' --json: one line, tensors as nested lists, NaN and inf as null."""
    return json.dumps(to_jsonable(data), indent=None)


def json_document(data: Any) -> str:
    """The doctor's and the sweep's --json: indented by 2, as they have always written it (their
    `to_dict()` holds plain JSON values already)."""
    return json.dumps(data, indent=2)


@dataclass(frozen=True)
class Shown:
    """What a probe's command line prints. Both are callables so that only the one asked for is made."""

    data: Callable[[], Any]  # --json: this, written by `as_json`
    text: Callable[[], str]  # otherwise: this table
    warnings: Sequence[str] = ()  # one `warning: ...` line each on stderr, after the output
    code: int = 0  # the exit code (the doctor's --fail-on: 1 for a finding that severe)
    as_json: Callable[[Any], str] = json_line

    @classmethod
    def of(cls, result: Any, text: Callable[[], str] | None = None, **kwargs: Any) -> Shown:
        """A result's `to_dict()` and its `format()` (or `text`)."""
        return cls(result.to_dict, text or result.format, **kwargs)


def show(output: Any, as_json: bool) -> int:
    """Print what a probe's `from_args` returned (nothing for None: it printed its own lines) and return the exit code."""
    if output is None:
        return 0
    shown = output if isinstance(output, Shown) else Shown.of(output)
    print(shown.as_json(shown.data()) if as_json else shown.text())
    for line in shown.warnings:
        print(f"warning: {line}", file=sys.stderr)
    return shown.code


def run_probe(build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str] | None,
              from_args: Callable[[argparse.Namespace], Any]) -> int:
    """A probe's whole `main`: the arguments parsed (inside `run_cli`, so that a refused argument is
    one line and exit 2 there too), `from_args(args)` run and what it returns shown (`show`)."""
    def body() -> int:
        args = build_parser().parse_args(argv)
        return show(from_args(args), getattr(args, "json", False))

    return run_cli(body)
