"""A run's logged history as the run doctor reads it: metrics.jsonl records (up to a step, as if
the run had stopped there), run.json's model and training config, and the snapshot steps on disk;
or the same records read from another trainer's log (`probes.doctor.sources`: a Hugging Face
trainer_state.json, TensorBoard events, nanoGPT's printed log).

Torch-free and model-free: the doctor judges a run from what training logged, in well under a
second. Values that JSON could not hold (NaN, inf) were written as null; here they read as NaN,
while a key that is absent means "not logged".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from models.store.run import (METRICS_FILE, CheckpointError, is_run_dir, is_snapshot_dir, list_snapshots,
                              read_metrics_log, read_run_json, run_model_config, snapshot_step)
from probes.doctor import flags
from probes.doctor.finding import NotChecked
from probes.doctor.log_file import Log
from probes.doctor.sources import find_log, snapshot_alone
from probes.errors import ProbeInputError

__all__ = ["RunHistory", "as_float", "by_step", "is_finite", "resolve_run"]

OURS = METRICS_FILE  # the source of a run written by our trainer or train.monitor.Monitor

NAN = float("nan")


def as_float(value: Any) -> float:
    """A logged number as a float: null/NaN/inf and non-numbers read as NaN."""
    if type(value) is float:  # the rules' hot path: most values are
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return NAN
    return float(value)


def is_finite(value: Any) -> bool:
    return math.isfinite(value if type(value) is float else as_float(value))


def by_step(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records in step order, the last one of each step kept (a resumed run redoes some)."""
    kept = {r["step"]: r for r in records if isinstance(r.get("step"), int)}
    return [kept[s] for s in sorted(kept)]


def resolve_run(path: str | Path) -> tuple[Path, int | None]:
    """(run directory, step limit): a run directory as it is, or a snapshot inside a run as the
    run up to that snapshot's step. Anything else is a ProbeInputError naming the path."""
    path = Path(path)
    if not path.exists():
        raise ProbeInputError(f"{path}: no such run directory")
    step = snapshot_step(path)
    if is_snapshot_dir(path) and step is not None and is_run_dir(path.parent):
        return path.parent, step
    if is_snapshot_dir(path):
        raise ProbeInputError(snapshot_alone(path))
    if not is_run_dir(path):
        raise ProbeInputError(f"{path}: not a run directory; the doctor reads a run directory (its metrics.jsonl)")
    return path, None


@dataclass
class RunHistory:
    """What one run logged, oldest record first, cut at `upto` (a step) when given."""

    path: Path
    records: list[dict[str, Any]]
    info: dict[str, Any] = field(default_factory=dict)  # run.json (empty when there is none)
    model: dict[str, Any] = field(default_factory=dict)  # the model config
    snapshot_steps: list[int] = field(default_factory=list)
    upto: int | None = None
    source: str = OURS  # where the records come from: metrics.jsonl, or a foreign log (Log.source)
    trainer: str = flags.OURS  # whose settings the fixes name (probes.doctor.flags)
    cache: dict[Any, Any] = field(default_factory=dict, repr=False)  # what rules derive, derived once
    skipped: int = 0  # malformed records of metrics.jsonl left out (each warned about with its line)
    loss_kind: str = "cross_entropy"  # what the loss is (probes.doctor.log_file.LOSS_KINDS)
    loss_kind_why: str = ""
    monitored: bool = False  # a foreign log holding the Monitor's mirrored readings and run.json

    @classmethod
    def read(cls, path: str | Path | None, upto: int | None = None, log: str | Path | None = None,
             tags: Iterable[str] | dict[str, str] | None = None) -> RunHistory:
        """The history at `path` (a run directory or a snapshot in one, a Trainer output directory
        or checkpoint-N/, a folder of TensorBoard events, a nanoGPT ckpt.pt or its folder with a
        *.log), or in the log file `log`; `tags` map a log's own names to ours (NAME=ours)."""
        foreign = find_log(path, log, tags)
        return cls.read_run(path, upto) if foreign is None else cls.from_log(foreign, upto)

    @classmethod
    def from_log(cls, log: Log, upto: int | None = None) -> RunHistory:
        """A foreign log's history; one the Monitor mirrored into (W&B, TensorBoard) with the
        run.json it mirrored, so that it reads as the run folder does."""
        kept = cut_at(log.path, log.records, upto)
        info = {**log.info, "train": log.train, "model": log.model} if log.info is not None else {"train": log.train}
        steps = info.get("snapshot_steps") if isinstance(info.get("snapshot_steps"), list) else []
        steps = [s for s in steps if isinstance(s, int) and (upto is None or s <= upto)]
        return cls(log.path, kept, info, log.model, steps, upto, log.source, log.trainer, skipped=log.skipped,
                   loss_kind=log.loss_kind, loss_kind_why=log.loss_kind_why, monitored=log.info is not None)

    @classmethod
    def read_run(cls, run_dir: str | Path, upto: int | None = None) -> RunHistory:
        """Our run directory (metrics.jsonl, run.json, snapshots), or a snapshot inside one."""
        run_dir, snapshot_limit = resolve_run(run_dir)
        if upto is None:
            upto = snapshot_limit
        try:
            log = read_metrics_log(run_dir)
            info = read_run_json(run_dir) or {}
            snapshots = list_snapshots(run_dir)
            model = run_model_config(run_dir)
        except CheckpointError as err:
            raise ProbeInputError(str(err)) from None
        if not log.records:
            raise ProbeInputError(f"{run_dir}: no metrics.jsonl records to diagnose (they are written by "
                                  "`python -m train` or train.monitor.Monitor)" + no_records_why(log.skipped_text()))
        kept = cut_at(run_dir, by_step(log.records), upto)
        steps = [s for p in snapshots if (s := snapshot_step(p)) is not None and (upto is None or s <= upto)]
        trainer = info.get("trainer") if info.get("trainer") in flags.TRAINERS else flags.OURS  # a Monitor's run
        return cls(run_dir, kept, info, model, steps, upto, trainer=trainer, skipped=len(log.skipped))

    # ------------------------------------------------------------------ facts about the run

    @property
    def first_step(self) -> int:
        return self.records[0]["step"]

    @property
    def last_step(self) -> int:
        return self.records[-1]["step"]

    @property
    def planned_steps(self) -> int:
        """The run's length as trained: its --steps, or its last record when run.json lacks it."""
        steps = (self.info.get("train") or {}).get("steps")
        return steps if isinstance(steps, int) and steps > 0 else max(self.last_step, 1)

    @property
    def span(self) -> int:
        """Steps covered by the records read (the whole run, or up to --step)."""
        return max(self.last_step - self.first_step, 1)

    def train_config(self, key: str, default: Any = None) -> Any:
        return (self.info.get("train") or {}).get(key, default)

    def logged_lr(self) -> list[tuple[int, float]]:
        """(step, lr) of every record that logged a finite learning rate."""
        return [(s, v) for s, v in self.series("lr") if math.isfinite(v)]

    def lr_now(self) -> float:
        """The learning rate at the end of the log (the last one logged, else the configured one)."""
        logged = self.logged_lr()
        return logged[-1][1] if logged else as_float(self.train_config("lr"))

    def lr_peak(self) -> float:
        """The largest logged learning rate (else the configured one): the schedule's peak."""
        logged = self.logged_lr()
        return max(v for _, v in logged) if logged else as_float(self.train_config("lr"))

    def grad_clip(self) -> float | None:
        """The gradient-clipping threshold the run trained with (0: off), where the run's settings or
        its trainer's default say; None when unknown. nanoGPT's and the Trainer's default is 1.0."""
        clip = as_float(self.train_config("grad_clip"))
        if math.isfinite(clip):
            return clip
        return flags.DEFAULT_CLIP.get(self.trainer)

    def series(self, key: str) -> list[tuple[int, float]]:
        """(step, value) of every record that logged `key` (NaN where it logged null)."""
        return [(r["step"], as_float(r[key])) for r in self.records if key in r]

    def with_key(self, key: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get(key) is not None]

    @property
    def foreign(self) -> bool:
        """Read from another trainer's log (which logs no model internals), not from metrics.jsonl
        nor from the W&B or TensorBoard run the Monitor mirrored its readings into."""
        return self.source != OURS and not self.monitored

    def flag(self, ours: str) -> str:
        """A `python -m train` flag as this run's trainer spells the same setting."""
        return flags.flag(ours, self.trainer)

    def not_logged(self, what: str, ours: str) -> NotChecked:
        """A rule's input is absent: from a foreign log, name the Monitor as the way to get it;
        from a run of ours, `ours` says why (a run that predates the metric, ...)."""
        if self.foreign:
            return NotChecked(f"not logged: {self.source} has no {what}; {flags.monitor_hint(self.trainer)}")
        return NotChecked(f"not logged: {ours}")


def cut_at(path: Path, ordered: list[dict[str, Any]], upto: int | None) -> list[dict[str, Any]]:
    """The records (in step order) at or before `upto`; a one-line error when none is."""
    kept = [r for r in ordered if upto is None or r["step"] <= upto]
    if not kept:
        raise ProbeInputError(f"{path}: no records at or before step {upto} "
                              f"(the first is step {ordered[0]['step']})")
    return kept


def no_records_why(skipped: str | None) -> str:
    """What an empty history adds to its error: every record was skipped, and where."""
    return f"; {skipped}: see the warnings" if skipped else ""
