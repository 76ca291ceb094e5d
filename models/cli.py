"""What every command line of the project shares: the parser, argument types, the --ckpt
arguments, JSON-safe values and the exit-2 convention.

Lives in `models/` because every layer has CLIs (`models.info`, `probes.*`, `train`) and
imports run one way: `train` and `probes` may use `models`, never the reverse. Torch-free on
purpose: `python -m X --help` and bad arguments are answered before torch is imported (about
4 s), so every parser is built from this module and other torch-free ones only.
"""

from __future__ import annotations

import argparse
import atexit
import math
import operator
import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from models.interrupts import EXIT_INTERRUPTED, EXIT_TERMINATED, exit_line, raising_signals  # noqa: F401

EXIT_BAD_INPUT = 2


class UsageError(ValueError):
    """A command line the parser refuses: `run_cli` prints its one line and returns 2."""


class HelpFormatter(argparse.HelpFormatter):
    """A flag's default appended to its help unless the help already says it; text with line
    breaks (the epilog's example commands) kept as written, one-line text wrapped."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # `is`, not `in`: a default of 0 equals False but is worth showing
        no_default = action.default == [] or any(action.default is v for v in (None, False, argparse.SUPPRESS))
        if not action.option_strings or "default" in text or no_default:
            return text
        return text + " (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


Check = Callable[[argparse.Namespace], "str | None"]


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (a UsageError, exit 2) and checks across arguments.

    `checks` run after parsing; each returns a problem (one line) or None.
    """

    def __init__(self, *args: Any, checks: Sequence[Check] = (), **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.checks = list(checks)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed = super().parse_args(args, namespace)
        for check in self.checks:
            problem = check(parsed)
            if problem:
                self.error(problem)
        return parsed

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{' '.join(message.split())} (see {self.prog} --help)")

    def parse_early(self, args: Sequence[str] | None = None) -> argparse.Namespace:
        """Parse, or answer --help (exit 0) or a bad command line (one line, exit 2) at once:
        `python -m X` calls it before its slow imports (main() parses again, for its caller)."""
        try:
            return self.parse_args(args)
        except UsageError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)


def number_type(kind: type, *, low: float | None = None, high: float | None = None,
                above: float | None = None, below: float | None = None,
                noun: str = "") -> Callable[[str], Any]:
    """An argparse `type=` for a finite int or float within bounds: low/high inclusive,
    above/below exclusive. `noun` starts the message (e.g. "batch size 0 is not ...")."""
    what = "an integer" if kind is int else "a number"
    if low is not None and high is not None:
        wanted = f"{what} in [{low}, {high}]"
    else:
        bounds = [f"{sign} {v}" for sign, v in ((">=", low), (">", above), ("<", below), ("<=", high))
                  if v is not None]
        wanted = f"{what} {' and '.join(bounds)}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or any(
                bound is not None and not ok(value, bound)
                for bound, ok in ((low, operator.ge), (above, operator.gt),
                                  (below, operator.lt), (high, operator.le))):
            raise argparse.ArgumentTypeError(f"{noun + ' ' if noun else ''}{text} is not {wanted}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in some of its own messages
    return parse


def path_text(text: str) -> str:
    """An argparse `type=` for a path flag: an empty one (`--ckpt ""`, an unset shell variable)
    is refused instead of read as the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty (an unset shell variable?)")
    return text


def path_type(text: str) -> Path:
    """`path_text` as a Path."""
    return Path(path_text(text))


POSITIVE_INT = number_type(int, low=1)
NON_NEGATIVE_INT = number_type(int, low=0)
POSITIVE_FLOAT = number_type(float, above=0)
FRACTION = number_type(float, low=0, high=1)


def add_ckpt_arguments(parser: argparse.ArgumentParser, *, required: bool = True,
                       preset_help: str | None = None) -> None:
    """Add --ckpt, --preset, --config, --tokenizer, --model-code and --device, the way every probe
    CLI takes a model."""
    parser.add_argument("--ckpt", required=required, metavar="PATH", type=path_text,
                        help="snapshot directory, run directory (its latest snapshot), nanoGPT "
                             "ckpt.pt or folder of them, Hugging Face causal-LM directory (GPT-2, "
                             "Llama, Qwen2, ...), nanochat model_N.pt or its dN folder, or a series "
                             ".pt state dict (with --preset or --config)")
    parser.add_argument("--preset", metavar="NAME",
                        help=preset_help or "the model preset of a series .pt state dict given as "
                                            "--ckpt (names: python -m models.info --list-presets)")
    parser.add_argument("--config", metavar="JSON", type=path_text,
                        help="model config JSON file for a series .pt state dict given as --ckpt "
                             "({\"family\": ..., ...})")
    parser.add_argument("--tokenizer", metavar="PATH", type=path_text,
                        help="for a nanoGPT checkpoint: its meta.pkl, or a directory with GPT-2's "
                             "tokenizer.json (or vocab.json and merges.txt)")
    parser.add_argument("--model-code", metavar="FILE.py:NAME",
                        help="for a snapshot of a model of your own (the Monitor's save_every): rebuild it "
                             "from your code, NAME(**model_args) in FILE.py (or module:NAME), to read any "
                             "text; runs that code, so give only your own (without it: the saved sample)")
    parser.add_argument("--device", default="auto",
                        help="torch device: auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON to stdout")


def to_jsonable(value: Any) -> Any:
    """Tensors -> nested lists, non-finite floats -> None (JSON has no NaN)."""
    torch = sys.modules.get("torch")  # no tensor exists before torch is imported: stay torch-free
    if torch is not None and isinstance(value, torch.Tensor):
        return to_jsonable(value.tolist())
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def exit_entry(code: int) -> NoReturn:
    """How a `python -m` entry ends once its work is done: atexit's functions run (logging's flush,
    Ray's shutdown), the streams are flushed, and the process leaves with `os._exit`, skipping the
    interpreter's teardown (~0.3 s with torch loaded). During that teardown Python has put the
    default signal handlers back, so a Ctrl-C landing there killed the process (status -2, no
    line), and after a Ctrl-C that `run_cli` had caught CPython 3.11 sometimes killed itself with
    SIGINT at exit (tests/test_interrupts.py saw both)."""
    if code not in (EXIT_INTERRUPTED, EXIT_TERMINATED):  # a stop says its line and goes at once
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to say
            pass
    os._exit(code)


def run_cli(body: Callable[[], int | None]) -> int:
    """Run a CLI body; bad input (any ValueError) becomes one line on stderr and exit code 2;
    Ctrl-C and SIGTERM (Terminated) one line and 130 / 143 (see models.interrupts)."""
    try:
        with raising_signals():
            return body() or 0
    except BrokenPipeError:  # `... | head -1` had what it wanted: stop quietly and successfully
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (Python's docs), so the exit
        return 0  # flush finds no closed pipe; no error happened that a user could act on
    except (ValueError, OSError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError:
        print("error: out of memory: use a smaller --batch-size, --samples or input", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM outside training's loop (loading, setting up)
        line, code = exit_line(exc)
        print(line, file=sys.stderr)
        return code
