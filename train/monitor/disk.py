"""The Monitor's writes to its run folder, kept from ending the training they watch: a folder made
read-only mid-run, a disk that fills up, a quota reached. The first failure is said in one line,
the Monitor then writes nothing more there (records and snapshots; its doctor and W&B mirror go on
from memory), and the line is said again when it closes. What `metrics.jsonl` holds stays whole up
to the failure: `models.store.run.append_metrics` cuts back a line it could not finish."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, TypeVar

from models.store.files import CheckpointError

log = logging.getLogger("train.monitor")

__all__ = ["RunFolderWrites"]

T = TypeVar("T")


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


class RunFolderWrites:
    """Runs each write to the run folder. After a record's write fails, none; after a snapshot's,
    no more snapshots (the records, a line each, may still fit where a snapshot did not)."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.failure: str | None = None  # why records (and snapshots) stopped
        self.snapshot_failure: str | None = None  # why snapshots stopped

    def write(self, what: str, step: int | None, write: Callable[[], T], snapshot: bool = False) -> T | None:
        """`write()`'s result, or None when it failed (said once) or an earlier write stopped it."""
        if self.failure is not None or (snapshot and self.snapshot_failure is not None):
            return None
        try:
            return write()
        except (OSError, CheckpointError) as err:  # read-only, full, quota: CheckpointError names the run
            text = f"{what}{f' at step {step}' if step is not None else ''} not written: {first_line(err)}"
            if snapshot:
                self.snapshot_failure = text
                log.warning("monitor: %s; no more snapshots are saved in %s (the training and its records "
                            "go on)", text, self.out_dir)
            else:
                self.failure = text
                log.warning("monitor: %s; nothing more is written to %s (the training goes on; its "
                            "records up to there are kept)", text, self.out_dir)
            return None

    def say_again(self) -> None:
        """At close: each failure once more, where the user looks last."""
        for failure, lost in ((self.snapshot_failure, "snapshots"), (self.failure, "records and snapshots")):
            if failure is not None:
                log.warning("monitor: %s: %s; the %s after that were not saved", self.out_dir, failure, lost)
