"""What a `train` run records besides snapshots: run.json, metrics.jsonl, the log line.

run.json describes what produced the run (a resumed run appends to its ``resumes`` list);
metrics.jsonl gets one JSON record per logged step (on resume, records after the snapshot
continued from are dropped and redone); the human log line is the series' style, rounded.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from train.data import Corpus, evaluate
from probes.updates import format_gwu
from models.runs import (METRICS_FILE, append_metrics, read_metrics, read_run_json,
                         write_bytes_atomic, write_run_json)
from train.config import DistInfo
from models.cli import to_jsonable

if TYPE_CHECKING:
    from train.loop import TrainState

log = logging.getLogger("train")

__all__ = ["run_description", "series_line", "to_json_line", "trim_metrics", "write_record",
           "write_run_json_for"]


# --------------------------------------------------------------------------- run files


def trim_metrics(run_dir: Path, step: int) -> None:
    """On resume, drop records logged after the snapshot we continue from (they will be redone)."""
    records = read_metrics(run_dir)
    kept = [r for r in records if r.get("step", 0) <= step]
    if len(kept) != len(records):
        log.info("resume: dropping %d metrics record(s) after step %d", len(records) - len(kept), step)
        text = "".join(to_json_line(r) for r in kept)
        write_bytes_atomic(run_dir / METRICS_FILE, text.encode("utf-8"))


def to_json_line(record: dict[str, Any]) -> str:
    return json.dumps(to_jsonable(record)) + "\n"


def run_description(args: argparse.Namespace, cfg: Any, tc: dict[str, Any], corpus: Corpus,
                    device: torch.device, dist: DistInfo, preset: str | None) -> dict[str, Any]:
    return {"preset": preset, "model": cfg.to_dict(), "overrides": args.set, "train": tc,
            "data": corpus.describe(),
            "tokenizer": {"kind": corpus.tokenizer.kind, "vocab_size": corpus.tokenizer.vocab_size},
            "torch": torch.__version__, "device": str(device), "world_size": dist.world_size,
            "compile": args.compile, "argv": sys.argv[1:] if args.argv is None else args.argv,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_run_json_for(state: TrainState) -> None:
    """Write run.json; on resume, keep the old one and append this start to its ``resumes``."""
    desc = run_description(state.args, state.cfg, state.tc, state.corpus, state.device, state.dist,
                           state.tc["preset"])
    old = read_run_json(state.args.out) if state.resumed_from else None
    if old:
        if old.get("data", {}).get("sha256") != desc["data"]["sha256"]:
            log.warning("resume: %s differs from the data the run started on", state.args.data)
        old.setdefault("resumes", []).append({"from_step": state.step, **desc})
        desc = old
    write_run_json(state.args.out, to_jsonable(desc))


# --------------------------------------------------------------------------- records


def series_line(record: dict[str, Any], steps: int) -> dict[str, Any]:
    """The human log line in the series' style (rounded, entropy keyed by int layer)."""
    tokens = record["tokens"]
    seen = f"{tokens / 1e6:.1f}M" if tokens >= 1e5 else f"{tokens / 1e3:.1f}K"
    line: dict[str, Any] = {"step": f"{record['step']}/{steps}", "tokens_seen": seen,
                            "lr": float(f"{record['lr']:.3g}")}
    if "attn_entropy" in record:
        line["attn_entropy"] = {int(k): [round(h, 3) for h in v]
                                for k, v in record["attn_entropy"].items()}
    if isinstance(record.get("train_loss"), float):
        record = {**record, "train_ppl": math.exp(min(record["train_loss"], 709))}
    for key in ("step_time_ms", "train_loss", "train_ppl", "val_loss", "val_ppl", "bpc"):
        if isinstance(record.get(key), float):
            line[key] = round(record[key], 3)
    return line


def write_record(state: TrainState, record: dict[str, Any], do_eval: bool) -> None:
    """Rank 0: add eval numbers, append to metrics.jsonl, log the human line (+ g/w/u table)."""
    if do_eval and state.val_blocks is not None:
        record.update(evaluate(state.raw_model, state.val_blocks, state.tc["batch_size"],
                               state.corpus.chars_per_token, state.autocast))
    append_metrics(state.args.out, to_jsonable(record))
    log.info("%s", series_line(record, state.tc["steps"]))
    if do_eval and record.get("gwu"):
        log.info("gradient info:\n%s", format_gwu(record["gwu"]))

