"""What every command line of the project shares: JSON-safe values and the exit-2 convention.

Lives in `models/` because every layer has CLIs (`models.info`, `probes.*`, `train`) and
imports run one way: `train` and `probes` may use `models`, never the reverse.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # the shell's code for Ctrl-C


def to_jsonable(value: Any) -> Any:
    """Tensors -> nested lists, non-finite floats -> None (JSON has no NaN)."""
    if isinstance(value, torch.Tensor):
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


def run_cli(body: Callable[[], int | None]) -> int:
    """Run a CLI body; bad input (any ValueError) becomes one line on stderr and exit code 2."""
    try:
        return body() or 0
    except BrokenPipeError:  # `... | head` closed stdout: stop quietly, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError) as err:
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MemoryError:
        print("error: out of memory: use a smaller --batch-size, --samples or input", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C outside training's own handler (loading, setting up)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
