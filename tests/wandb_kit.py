"""W&B runs written by the real `wandb` package, offline (no network, no account): the env it needs
and one run written with it. A first `wandb.init` in a process costs ~1 s (its core starts), the
next ones ~0.03 s: the test modules write their runs once, in module-scoped fixtures."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest


@contextmanager
def offline_wandb(root: Path) -> Iterator[Any]:
    """`wandb` set to write offline under `root` (its config and caches too), silent, no console
    capture; its core process shut at the end."""
    wandb = pytest.importorskip("wandb")  # a fallback: the dev extra installs it
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true",
           "WANDB_CONFIG_DIR": str(root / "config"), "WANDB_CACHE_DIR": str(root / "cache"),
           "WANDB_DATA_DIR": str(root / "data"), "WANDB_CONSOLE": "off",
           # no git, code, system stats, machine facts or requirements gathered: a later init 0.03 s, not 0.25
           "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_X_DISABLE_STATS": "true",
           "WANDB_X_DISABLE_META": "true", "WANDB_X_DISABLE_MACHINE_INFO": "true", "WANDB_X_SAVE_REQUIREMENTS": "false"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        try:
            yield wandb
        finally:
            if wandb.run is not None:
                wandb.run.finish()
            wandb.teardown()


def write_run(wandb: Any, rows: list[dict[str, Any]], config: dict[str, Any] | None = None) -> Path:
    """One offline run logging `rows` (one wandb.log call each); its run folder."""
    run = wandb.init(project="scratchscope-tests", config=config or {}, settings=wandb.Settings(console="off"))
    for row in rows:
        wandb.log(row)
    run.finish()
    return Path(run.dir).parent  # run.dir is <run folder>/files
