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
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from train.data import Corpus, evaluate
from probes.update_parts.report import UpdateReport, layout_groups_of
from models.store.run import read_run_json, trim_metrics, write_run_json  # noqa: F401 (trim_metrics re-exported)
from train.config import DistInfo
from train.guard import Guard
from models.cli import to_jsonable

if TYPE_CHECKING:
    from train.state import TrainState

log = logging.getLogger("train")

__all__ = ["console_line", "open_monitor", "run_description", "run_json_for", "to_json_line", "trim_metrics",
           "write_record", "write_run_json_for"]


# --------------------------------------------------------------------------- run files


def to_json_line(record: dict[str, Any]) -> str:
    return json.dumps(to_jsonable(record)) + "\n"


PATH_FLAGS = ("--data", "--out")  # recorded relative to the working directory when inside it


def portable_path(path: str | Path) -> str:
    """An absolute path inside the working directory (the repository, for its users) as a
    relative one, so that run.json names no machine's directories; others as given."""
    path = Path(path)
    if path.is_absolute():
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return str(path)
    return str(path)


def portable_argv(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, word in enumerate(argv):
        if word in PATH_FLAGS and i + 1 < len(argv):
            out[i + 1] = portable_path(argv[i + 1])
        elif word.split("=", 1)[0] in PATH_FLAGS and "=" in word:
            flag, value = word.split("=", 1)
            out[i] = f"{flag}={portable_path(value)}"
    return out


def run_description(args: argparse.Namespace, cfg: Any, tc: dict[str, Any], corpus: Corpus,
                    device: torch.device, dist: DistInfo, preset: str | None) -> dict[str, Any]:
    argv = portable_argv(sys.argv[1:] if args.argv is None else list(args.argv))
    guard = getattr(args, "guard", None)  # --guard: its settings, as a Monitor's guard= records them
    return {"preset": preset, "model": cfg.to_dict(), "overrides": args.set, "train": tc,
            **({"guard": Guard(mode=guard).to_json()} if guard else {}),
            "data": {**corpus.describe(), "path": portable_path(corpus.path)},
            "tokenizer": {"kind": corpus.tokenizer.kind, "vocab_size": corpus.tokenizer.vocab_size},
            "torch": torch.__version__, "device": str(device), "world_size": dist.world_size,
            "compile": args.compile, "argv": argv,
            "command": "python -m train " + shlex.join(argv),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def run_json_for(state: TrainState) -> dict[str, Any]:
    """run.json's content; on resume, the old one with this start appended to its ``resumes``."""
    desc = run_description(state.args, state.cfg, state.tc, state.corpus, state.device, state.dist,
                           state.tc["preset"])
    old = read_run_json(state.args.out) if state.resumed_from else None
    if old:
        if old.get("data", {}).get("sha256") != desc["data"]["sha256"]:
            log.warning("resume: %s differs from the data the run started on", state.args.data)
        old.setdefault("resumes", []).append({"from_step": state.step, **desc})
        desc = old
    return desc


def write_run_json_for(state: TrainState) -> None:
    write_run_json(state.args.out, to_jsonable(run_json_for(state)))


def open_monitor(state: TrainState) -> None:
    """Rank 0's Monitor (`train.monitor`), the one path every run's records take: it writes
    run.json, measures each log step's g/w/u on the optimizer's own step and, at eval steps, the
    model's internals on the first --batch-size val windows. The trainer holds the run's lock."""
    from train.monitor import Monitor

    tc = state.tc
    tokens = None if state.val_blocks is None else state.val_blocks[:tc["batch_size"], :-1]  # [batch pos]
    state.monitor = Monitor(state.raw_model, state.optimizer, state.args.out, log_every=tc["log_every"],
                            eval_every=tc["eval_every"], eval_tokens=tokens, steps=tc["steps"],
                            start_step=state.step + 1,  # a step is numbered after it is taken
                            resume=state.resumed_from is not None,
                            run_info=run_json_for(state), report=False, autocast=state.autocast, lock=False)


# --------------------------------------------------------------------------- records


def tokens_text(tokens: int) -> str:
    """3 significant digits, so the count visibly moves between log lines (0.104M, 0.108M...)."""
    return f"{tokens / 1e6:.3g}M" if tokens >= 1e5 else f"{tokens / 1e3:.3g}K"


def entropy_text(attn_entropy: dict[str, list[float | None]]) -> str:
    """Per layer the lowest head entropy (nats): a collapsing head shows as a number near 0."""
    parts = []
    for layer, heads in attn_entropy.items():
        finite = [h for h in heads if isinstance(h, float) and math.isfinite(h)]
        parts.append("nan" if len(finite) < len(heads) else f"{min(finite):.2f}")
    return "H min " + " ".join(parts)


def console_line(record: dict[str, Any], steps: int) -> str:
    """One compact line per log step: step, losses, lr, tokens, speed, lowest head entropies."""
    width = len(str(steps))
    parts = [f"step {record['step']:>{width}}/{steps}"]
    if isinstance(record.get("train_loss"), float):
        parts.append(f"loss {record['train_loss']:.3f}")
    if isinstance(record.get("val_loss"), float):
        parts.append(f"val {record['val_loss']:.3f} ppl {record['val_ppl']:.2f} bpc {record['bpc']:.3f}")
    parts.append(f"lr {record['lr']:.2e}")
    parts.append(f"{tokens_text(record['tokens'])} tok")
    if isinstance(record.get("step_time_ms"), float):
        parts.append(f"{record['step_time_ms']:.0f} ms/step")
    if record.get("attn_entropy"):
        parts.append(entropy_text(record["attn_entropy"]))
    return " | ".join(parts)


def write_record(state: TrainState, record: dict[str, Any], do_eval: bool, first_bad: int = -1,
                 rescue: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rank 0: add the val loss, then the Monitor adds the step's g/w/u (and the internals at an
    eval step), marks a divergence and appends the record to metrics.jsonl; log one line
    (+ the g/w/u group summary, or the whole table with --gwu-table). `rescue`: what the guard
    (--guard) is about to do, kept in the record. Returns the record."""
    if do_eval and state.val_blocks is not None:
        record.update(evaluate(state.raw_model, state.val_blocks, state.tc["batch_size"],
                               state.corpus.chars_per_token, state.autocast))
    monitor = state.monitor
    if first_bad >= 0 and monitor.first_nonfinite_step is None:
        monitor.first_nonfinite_step = first_bad
    monitor.record(record.pop("step"), **record)
    if rescue is not None:
        monitor._pending["rescue"] = rescue  # a name the Monitor owns: no user value may take it
    record = monitor.flush()
    log.info("%s", console_line(record, state.tc["steps"]))
    if do_eval and record.get("gwu"):
        # grouped as run.json groups them (a model's roles), as the doctor, the app and the W&B mirror do
        report = UpdateReport.from_table(record["gwu"], step=record["step"], lr=record["lr"],
                                         layout_groups=layout_groups_of(read_run_json(state.args.out)))
        if state.args.gwu_table:
            log.info("g / w / u at step %d:\n%s", record["step"], "\n".join(report.table_lines()))
        log.info("    %s", report.summary())
    layers = [a for a in (record.get("activations") or {}).values() if a["dead"] is not None]
    if do_eval and layers:
        log.info("    %s", activation_line(layers, getattr(state.cfg, "act_fn", None)))
    warn_if_flat(state, record)
    return record


FLAT_TOLERANCE = 0.01  # relative change of the train loss below which it counts as flat


def activation_line(layers: list[dict[str, Any]], act_fn: str | None) -> str:
    """The console's MLP line. A ReLU's zeros are not saturation (its slope is 0 there, but a unit
    that is 0 on some inputs still learns on others: the doctor calls that sparse, not flat), so
    for a ReLU the share of zero outputs is said as what it is."""
    dead = 100 * max(a["dead"] for a in layers)
    flat = 100 * max((a["saturated"] for a in layers if a["saturated"] is not None), default=0.0)
    if act_fn == "relu":
        return f"MLP units: up to {dead:.0f}% dead; {flat:.0f}% of ReLU outputs are zero (sparse, not saturated)"
    return f"MLP units: up to {dead:.0f}% dead, {flat:.0f}% of activations saturated"


def warn_if_flat(state: TrainState, record: dict[str, Any]) -> None:
    """Once, a tenth into the run: warn if the loss has not moved (lr too small, warmup too long).

    Compares the val loss with the one at the start (the val batches are fixed, so only the
    weights can move it); the train loss, noisier, stands in where there is no val split.
    """
    key = "val_loss" if state.val_blocks is not None else "train_loss"
    loss = record.get(key)
    if not isinstance(loss, float) or state.flat_checked:
        return
    if state.first_loss is None:
        state.first_loss = loss
        return
    if record["step"] < max(state.tc["steps"] // 10, 5 * state.tc["log_every"]):
        return
    state.flat_checked = True
    if abs(loss - state.first_loss) < FLAT_TOLERANCE * abs(state.first_loss):
        log.warning("the %s has not moved in %d steps (%.4f -> %.4f): the learning rate "
                    "(now %.2e) may be too small or still warming up", key.replace("_", " "),
                    record["step"], state.first_loss, loss, record["lr"])
