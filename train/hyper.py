"""A run's hyperparameters resolved and checked, torch-free: `python -m train` resolves them at its
start, and `python -m train.sweep` checks every grid point with the same rules before any run
starts (a --vary value the trainer would refuse is refused up front, not 30 s into the sweep).

A hyperparameter comes from, in order: its flag, the resumed run's saved train config, the preset's
recorded recipe (`PRESETS[name].train`), the built-in default (`train.args.TRAIN_DEFAULTS`).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from train.args import OPTIMIZERS, TRAIN_DEFAULTS

__all__ = ["resolve_train_config"]

PRESET_KEY_NAMES = {"warmup_steps": "warmup"}  # PRESETS[name].train key -> our key
OPTIONAL_NUMBERS = {"unembed_weight_decay"}  # None: not set (the others' values apply)
NUMBER_RULES = [  # (key, test on a finite value, what the message asks for)
    ("lr", lambda v: v > 0, "a finite number > 0"),
    ("momentum", lambda v: 0 <= v < 1, "a number in [0, 1)"),
    ("weight_decay", lambda v: v >= 0, "a finite number >= 0"),
    ("min_lr_ratio", lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    ("grad_clip", lambda v: v >= 0, "a finite number >= 0 (0 = off)"),
    ("z_loss", lambda v: v >= 0, "a finite number >= 0 (0 = off)"),
    ("unembed_weight_decay", lambda v: v >= 0, "a finite number >= 0")]


def resolve_train_config(args: argparse.Namespace, preset_train: dict[str, Any],
                         saved: dict[str, Any]) -> dict[str, Any]:
    """Flag > resumed run's saved value > preset recipe > built-in default, then validated."""
    recipe = {PRESET_KEY_NAMES.get(k, k): v for k, v in preset_train.items()}
    tc: dict[str, Any] = {}
    for key, default in TRAIN_DEFAULTS.items():
        flag = getattr(args, key, None)
        tc[key] = flag if flag is not None else saved.get(key, recipe.get(key, default))
    tc["betas"] = list(tc["betas"])
    if tc["schedule"] is None:
        tc["schedule"] = "cosine" if tc["warmup"] > 0 else "constant"
    for key in ("steps", "batch_size", "grad_accum", "log_every", "eval_every", "eval_batches"):
        if not isinstance(tc[key], int) or tc[key] < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be a positive integer, got {tc[key]!r}")
    for key in ("warmup", "save_every"):
        if tc[key] < 0:
            raise ValueError(f"--{key.replace('_', '-')} must be >= 0, got {tc[key]}")
    if tc["batch_size"] * tc["grad_accum"] > 1 << 20:
        raise ValueError(f"--batch-size {tc['batch_size']} x --grad-accum {tc['grad_accum']} windows "
                         "per step is more than any machine holds; use at most 1048576")
    for key, test, wanted in NUMBER_RULES:
        value = tc[key]
        if value is None and key in OPTIONAL_NUMBERS:
            continue
        if not (isinstance(value, (int, float)) and math.isfinite(value) and test(value)):
            raise ValueError(f"--{key.replace('_', '-')} must be {wanted}, got {value!r}")
    if not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in tc["betas"]):
        raise ValueError(f"--betas must be two numbers in [0, 1), got {tc['betas']}")
    if tc["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {tc['optimizer']!r}")
    return tc
