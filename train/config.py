"""What a `train` run is set up from: model config, optimizer, LR schedule, processes (the
hyperparameters themselves are resolved and checked, torch-free, in `train.hyper`). Weight decay
applies only to parameters with 2+ dims and the schedule is linear warmup then constant or cosine down to
10% (the GPT-2 recipe of the blog feed); the series itself trained with a constant lr.
Under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set) `init_distributed` joins the process group.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from models.presets import PRESETS
from train.args import parse_sets

log = logging.getLogger("train")


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
