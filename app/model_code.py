"""The user's word that the app may run their model's code: `streamlit run app/main.py -- --runs
runs/ --model-code path/to/mygpt.py:GPT` (several specs for several models; the environment's
SCRATCHSCOPE_MODEL_CODE too, specs separated by ";", since ":" is the spec's own). Only then is a snapshot of any model (the
Monitor's save_every on a model of one's own) rebuilt from that code, so that its pages read any
text; without it they show the sample saved with it. Given at the server's start, never in the
page: whoever opens the page cannot make the server run a file. Torch-free.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from models.store.any_files import is_any_snapshot
from models.store.files import CheckpointError, read_json_object

ENV = "SCRATCHSCOPE_MODEL_CODE"


def specs() -> list[str]:
    """Every --model-code given after `--`, then the environment's."""
    parser = argparse.ArgumentParser(prog="streamlit run app/main.py --", add_help=False)
    parser.add_argument("--model-code", nargs="+", default=[])
    args, _ = parser.parse_known_args(sys.argv[1:])
    return [*args.model_code, *(s.strip() for s in os.environ.get(ENV, "").split(";") if s.strip())]


def spec_for(snapshot: Path) -> str | None:
    """The spec that rebuilds this snapshot of any model: the one whose NAME is its class's; None
    for a snapshot of another class (never built with someone else's code: its pages read what it
    saved), for any other checkpoint, or none given."""
    given = specs()
    config = snapshot / "config.json"
    if not given or not config.is_file():
        return None
    try:
        meta = read_json_object(config)
    except CheckpointError:
        return None  # the loader says what is wrong with it
    if not is_any_snapshot(meta):
        return None
    name = str(meta.get("class") or "").rsplit(".", 1)[-1]
    named = [s for s in given if s.rpartition(":")[2] == name]
    return named[0] if named else None
