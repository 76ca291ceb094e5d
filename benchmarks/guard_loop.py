"""The loop of benchmarks/bench_guard.py: one case (benchmarks/guard_cases.py) trained in one arm
(benchmarks/guard_arms.py), our plain loop (forward, backward, the arm's check, step, schedule, the
arm's look) over the case's `Recipe`: ours and the Llama-style GPT on Tiny Shakespeare, the phase
kind on its own model and data (benchmarks/guard_phase.py); the hf kind in a Trainer
(benchmarks/guard_hf.py). The benchmark's files import one way: bench_guard -> guard_loop ->
guard_hf -> guard_arms -> guard_cases -> guard_phase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from guard_arms import WATCHERS
from guard_cases import Case, Outcome, batch, build, build_llama, optimizer_and_schedule, val_loss, weights_hash
from guard_hf import train_hf
from guard_phase import build_phase, phase_batch, phase_eval_tokens, phase_loss, phase_optimizer, phase_val

GUARDED_ARMS = ("guard", "guard_loss", "guard_check", "monitor")  # arms that run a Monitor or a guard


@dataclass
class Recipe:
    """What a case trains: the model, its optimizer and schedule, the loss of each step's batch, the
    held-out loss, and the Monitor's eval tokens where the arm's own (Shakespeare windows) do not fit."""

    model: Any
    optimizer: Any
    scheduler: Any
    loss_at: Callable[[int], Any]  # step -> the batch's loss (a scalar tensor)
    val: Callable[[], float]
    eval_tokens: Any = None


def recipe(case: Case, seed: int, steps: int) -> Recipe:
    """The case's model (seeded), optimizer, batches and held-out loss."""
    import torch.nn.functional as F

    if case.family == "phase":
        model = build_phase(seed)
        optimizer, scheduler = phase_optimizer(model, case.lr)
        return Recipe(model, optimizer, scheduler, lambda step: phase_loss(model, *phase_batch(seed, step)),
                      lambda: phase_val(model), phase_eval_tokens())
    model = build_llama(seed) if case.family == "llama" else build(seed)
    optimizer, scheduler = optimizer_and_schedule(case, model, steps)

    def loss_at(step: int) -> Any:
        x, y = batch(case, seed, step, steps)
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    return Recipe(model, optimizer, scheduler, loss_at, lambda: val_loss(model, case))


def train(case: Case, arm: str, seed: int, steps: int, options: dict[str, Any] | None = None,
          keep_state: bool = False) -> Outcome:
    """One run of `case` in `arm` (our loop; the hf kind in a Trainer); its Outcome."""
    import time

    import torch

    if case.family == "hf":
        return train_hf(case, arm, seed, steps, options)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    r = recipe(case, seed, steps)
    model, optimizer = r.model, r.optimizer
    out = Outcome(case, arm, seed, init_val=r.val(), final_val=math.nan)
    options = dict(options or {})
    if r.eval_tokens is not None and arm in GUARDED_ARMS:
        options["tokens"] = r.eval_tokens
    watcher = WATCHERS[arm](model, optimizer, options)
    lowest = math.inf
    for step in range(steps):
        loss = r.loss_at(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        value = loss.item()
        out.rose |= not math.isfinite(value) or value > lowest + 1.0
        lowest = min(lowest, value)
        if watcher.before_step(step, value):
            optimizer.step()
        r.scheduler.step()
        if watcher.after_step(step, value):
            break  # the arm stopped the run
    out.seconds = time.perf_counter() - t0
    out.final_val = r.val()
    watcher.report(out)
    out.weights = weights_hash(model)
    out.state_bytes = sum(t.numel() * t.element_size() for t in model.parameters()) + sum(
        v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
        if isinstance(v, torch.Tensor))
    if keep_state:
        out.state = {k: v.clone() for k, v in model.state_dict().items()}
    return out
