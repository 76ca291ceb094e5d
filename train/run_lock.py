"""What keeps a run directory whole: one writer at a time, leftovers of killed saves cleaned up,
and optimizer state checked against the model before it is trusted.

Readers (probes, the app) never take the lock: snapshots are renamed into place atomically and
they ignore the dot-named temporary directories.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.store.files import CheckpointError, current_umask, writing

if TYPE_CHECKING:  # torch-free at import: the sweep driver asks lock_holder without loading torch
    import torch

log = logging.getLogger("train")

LOCK_FILE = ".train.lock"
LEFTOVER = re.compile(r"^\.(?P<target>step_\d{6})\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


class RunLock:
    """An exclusive `flock` on RUN_DIR/.train.lock, held for the whole training.

    The kernel drops it when the process dies, however it dies, so a killed trainer never
    leaves a run locked; the pid written into the file is only there to name the holder. The
    file is removed on release (while still locked), so finished runs carry none: a trainer that
    opened it just before then finds its locked file unlinked and takes a fresh one.
    """

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK_FILE
        self.fd: int | None = None
        self.created_dir = False  # --out was made for this training: remove it if nothing came of it

    def acquire(self) -> RunLock:
        while True:
            with writing(self.path.parent):  # a read-only or full run directory: one line naming it
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~current_umask())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = named_holder(fd)
                os.close(fd)
                raise ValueError(f"{self.path.parent} is being trained by another process (pid "
                                 f"{holder}); wait for it to finish or choose another --out") from None
            if self._still_linked(fd):
                break
            os.close(fd)  # its holder removed it as we opened it: lock the file that is there now
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self.fd = fd
        return self

    def _still_linked(self, fd: int) -> bool:
        try:
            there = os.stat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Remove the lock file (still holding the lock), then unlock; an --out made for a
        training that failed its checks goes too, so it leaves nothing behind."""
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError as err:  # a run folder made read-only meanwhile: the file stays, the lock still goes
            log.warning("%s: not removed (%s); the lock is released", self.path, err.strerror or err)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None
        if self.created_dir and not any(self.path.parent.iterdir()):
            self.path.parent.rmdir()


def named_holder(fd: int) -> str:
    """The pid a held lock file names (written by its holder), or "unknown"."""
    return os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"


def lock_holder(run_dir: Path) -> str | None:
    """Who trains `run_dir` now: the pid its lock file names ("unknown" if none is written), or
    None when no live process holds the lock. Takes nothing: a free lock is released at once."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return named_holder(fd)
    finally:
        os.close(fd)  # closing drops a shared lock taken just now
    return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_leftovers(run_dir: Path) -> list[str]:
    """Remove what a killed save left behind (`.step_N.tmp-PID`, `.step_N.old-PID` of dead pids).

    An `.old-PID` directory whose snapshot is missing is the only copy (the kill came between
    setting the old snapshot aside and renaming the new one in): it is put back, not removed.
    Call with the run lock held. Returns what was done, one line each (also logged).
    """
    done = []
    for path in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        match = LEFTOVER.match(path.name)
        if not match or pid_alive(int(match["pid"])):
            continue
        target = run_dir / match["target"]
        if match["kind"] == "old" and not target.exists():
            os.replace(path, target)
            done.append(f"restored {target.name} from {path.name} (a save was killed mid-swap)")
        else:
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed {path.name}, left by a killed save (pid {match['pid']} is gone)")
    for line in done:
        log.warning("%s", line)
    return done


def check_optimizer_state(state: Any, optimizer: torch.optim.Optimizer, source: Path) -> None:
    """Refuse optimizer state whose structure or tensor shapes do not fit this model's optimizer."""
    import torch

    def refuse(why: str) -> None:
        raise CheckpointError(f"{source}: optimizer state does not fit this model ({why}); "
                              "it was saved by another model or optimizer")

    if not isinstance(state, dict) or not isinstance(state.get("param_groups"), list) \
            or not isinstance(state.get("state"), dict):
        refuse(f"expected a dict with 'state' and 'param_groups', got {type(state).__name__}")
    groups = optimizer.param_groups
    if len(state["param_groups"]) != len(groups):
        refuse(f"{len(state['param_groups'])} parameter groups, the optimizer has {len(groups)}")
    params = [p for group in groups for p in group["params"]]
    saved_ids = [i for group in state["param_groups"] for i in (group.get("params") or [])
                 if isinstance(group, dict)]
    if len(saved_ids) != len(params):
        refuse(f"{len(saved_ids)} parameters, the model has {len(params)}")
    by_id = dict(zip(saved_ids, params))
    for key, entry in state["state"].items():
        if key not in by_id or not isinstance(entry, dict):
            refuse(f"state for an unknown parameter {key!r}")
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != by_id[key].shape:
                refuse(f"{name} of parameter {key} has shape {tuple(value.shape)}, "
                       f"the parameter {tuple(by_id[key].shape)}")
