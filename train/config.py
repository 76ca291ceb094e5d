"""What a `train` run is set up from: hyperparameters, optimizer, LR schedule, processes.

A hyperparameter comes from, in order: its flag, the resumed run's saved train config, the preset's
recorded recipe (`PRESETS[name].train`), the built-in default below. Weight decay applies only
to parameters with 2+ dims and the schedule is linear warmup then constant or cosine down to
10% (the GPT-2 recipe of the blog feed); the series itself trained with a constant lr.
Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set) `init_distributed` joins the process group.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from models.presets import PRESETS
from train.args import OPTIMIZERS, TRAIN_DEFAULTS, parse_sets, train_config_flags  # noqa: F401  (torch-free)

log = logging.getLogger("train")


PRESET_KEY_NAMES = {"warmup_steps": "warmup"}
OPTIONAL_NUMBERS = {"unembed_weight_decay"}  # None: not set (the others' values apply)  # PRESETS[name].train key -> our key
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


def model_config(preset: str, sets: list[str], vocab_size: int) -> Any:
    """The preset's config with --set overrides; d_vocab follows the tokenizer unless set."""
    cfg = PRESETS[preset].config
    overrides = parse_sets(cfg, sets)
    if "d_vocab" in overrides:
        if overrides["d_vocab"] < vocab_size:
            raise ValueError(f"--set d_vocab={overrides['d_vocab']} is smaller than the tokenizer's "
                             f"{vocab_size} tokens")
    elif cfg.d_vocab != vocab_size:
        overrides["d_vocab"] = vocab_size  # setup() logs it once the input is known to be good
    return cfg.replace(**overrides)


def unembedding_for_decay(model: torch.nn.Module, decay: float | None) -> torch.nn.Parameter | None:
    """W_out when --unembed-weight-decay is given (its own weight-decay group), else None."""
    if decay is None:
        return None
    unembed = getattr(model, "W_out", None)
    if not isinstance(unembed, torch.nn.Parameter):
        raise ValueError("--unembed-weight-decay needs a separate unembedding matrix W_out; this model's "
                         f"unembed is {getattr(model.cfg, 'unembed', None)!r} (try --set unembed=separate)")
    return unembed


def build_optimizer(model: torch.nn.Module, tc: dict[str, Any], device: torch.device):
    """SGD / Adam / AdamW; weight decay only on parameters with 2+ dims (matrices, embeddings)."""
    params = [p for p in model.parameters() if p.requires_grad]
    unembed = unembedding_for_decay(model, tc.get("unembed_weight_decay"))
    groups = [{"params": [p for p in params if p.dim() >= 2 and p is not unembed], "weight_decay": tc["weight_decay"]},
              {"params": [p for p in params if p is unembed], "weight_decay": tc.get("unembed_weight_decay")},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    if tc["optimizer"] == "sgd":
        return torch.optim.SGD(groups, lr=tc["lr"], momentum=tc["momentum"],
                               nesterov=bool(tc["nesterov"]) and tc["momentum"] > 0)
    cls = torch.optim.Adam if tc["optimizer"] == "adam" else torch.optim.AdamW
    fused = {"fused": True} if device.type == "cuda" else {}
    return cls(groups, lr=tc["lr"], betas=tuple(tc["betas"]), **fused)


def lr_at(step: int, tc: dict[str, Any]) -> float:
    """Learning rate of update number `step` (0-based): linear warmup, then constant or cosine."""
    lr, warmup = tc["lr"], tc["warmup"]
    if step < warmup:
        return lr * (step + 1) / warmup
    if tc["schedule"] == "constant":
        return lr
    progress = min(1.0, (step - warmup) / max(1, tc["steps"] - 1 - warmup))
    floor = lr * tc["min_lr_ratio"]
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - floor)


# --------------------------------------------------------------------------- processes


@dataclass
class DistInfo:
    """This process's place in a torchrun launch (rank 0 of 1 when not launched by torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, value: float) -> float:
        """The average of `value` over ranks (itself without DDP)."""
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return float(t) / self.world_size

    def wait_for_all(self) -> None:
        """A barrier on the way out of a run every rank finished: a rank that tears gloo down (and
        exits) while rank 0 is still writing its records and diagnosis could abort at exit
        ('terminate called without an active exception', once in a CI run of the DDP test)."""
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.barrier()

    def close(self) -> None:
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def init_distributed(device_name: str) -> DistInfo:
    """Join the process group torchrun describes in RANK / WORLD_SIZE / LOCAL_RANK (nccl or gloo)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    dist = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = device_name != "cpu" and torch.cuda.is_available()
    if cuda:
        dist.device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(dist.device)
    torch.distributed.init_process_group(backend="nccl" if cuda else "gloo")
    return dist
