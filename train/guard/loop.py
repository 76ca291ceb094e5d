"""`python -m train --guard`: the guard in our own loop. The loop keeps each step's loss on the
device (no per-step sync); at a record step the losses since the last one are read together (one
read, averaged over the ranks under torchrun: every rank judges the same numbers) and judged in
order. Trouble makes a plan that the step's record carries before it is carried out, so the
record's val loss and internals are those of the state in trouble; a stop restores the last good
state and saves it as the snapshot of its own step (never over one on disk)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from models.checkpoint import snapshot_name
from train.monitor.save import save_with_view
from train.guard import Guard
from train.guard.run import GuardedRun, Plan
from train.guard.monitor import stop_line

if TYPE_CHECKING:
    from train.state import TrainState

log = logging.getLogger("train")

__all__ = ["attach", "judge_steps", "stop_run"]


def attach(state: TrainState) -> GuardedRun | None:
    """Every rank's guard on the raw model and optimizer (--guard), hooked before the Monitor."""
    mode = getattr(state.args, "guard", None)
    return GuardedRun(Guard(mode=mode), state.raw_model, state.optimizer, start_step=None) if mode else None


def judge_steps(state: TrainState, seen: list[torch.Tensor]) -> Plan | None:
    """Judge each step's loss since the last record (`seen`, on the device, the newest last): the
    plan for the first step that calls for one (carried out at this record's step), or None (then
    a snapshot of the state now, when due)."""
    guard = state.guard
    if guard is None or guard.stopped or not seen:
        return None
    losses = torch.stack(seen).double()  # [steps]
    if state.dist.enabled:
        torch.distributed.all_reduce(losses)
        losses /= state.dist.world_size
    first = state.step - len(seen) + 1
    collapsed = read_attention(state) if guard.attention_due(state.step) else None
    for i, loss in enumerate(losses.tolist()):
        plan = guard.observe(first + i, loss, collapse=collapsed if i == len(seen) - 1 else None, now=state.step)
        if plan is not None:
            return plan
    guard.keep(state.step)
    return None


ATTENTION_ROWS = 8  # val blocks the attention is read on (the Monitor's eval tokens in a user's loop)


def read_attention(state: TrainState) -> int | None:
    """Each head's attention entropy on the first val blocks, read by the guard (`train.guard.attention`):
    the step of the last reading before a fast collapse, or None. Every rank reads the same
    replica on the same blocks, so every rank decides alike; a model without heads has nothing to read."""
    blocks = getattr(state, "val_blocks", None)
    if blocks is None:
        return None
    from train.data import attention_entropy
    entropy = attention_entropy(state.raw_model, blocks[:ATTENTION_ROWS, :-1], state.autocast)
    return state.guard.attention.see(state.step, entropy, blocks.shape[-1] - 1)


def stop_run(state: TrainState, plan: Plan, per_step: int) -> None:
    """The guard stopped the run (the last good state is back in the model): save it as the
    snapshot of its own step, say why and what to change."""
    restored = plan.record.get("restored_step")
    saved = None
    if restored is not None and restored >= 0 and state.dist.is_main:
        saved = state.args.out / snapshot_name(restored)
        if not saved.exists():
            save_with_view(saved, state.raw_model, state.corpus.tokenizer, step=restored,  # the app opens it first
                           tokens_seen=max(0, state.tokens - (state.step - restored) * per_step),
                           train_config=state.tc, optimizer=state.optimizer)
    state.last_saved = state.step  # the loop's closing save would label the restored weights step N
    if state.dist.is_main:
        qk = getattr(state.cfg, "qk_norm", "none") != "none" or not getattr(state.cfg, "n_heads", 0)
        log.error("%s", stop_line(plan.step, plan.record, state.guard, saved, qk_norm=qk))
