"""The runs of benchmarks/bench_guard.py: one small GPT trained at one learning rate and seed, in
one of four arms, each a plain loop (forward, backward, AdamW step, a LambdaLR schedule):

- none: nothing watches the run;
- palm: PaLM's manual recipe made automatic: on a spike (the guard's own detector) restore the
  snapshot taken about 100 steps before, skip the batches in between, keep the rate (snapshots
  every 50 steps, 3 held, and the state at the start, as the guard's; at most 20 rewinds);
- skip: OLMo-core's SkipStepOptimizer rule: the update is skipped when the loss or the gradient
  norm lies more than 6 standard deviations from its mean over the last 128 steps (judged once
  64 are held);
- guard: `train.guard.Guard` (its defaults unless told), through `Guard.attach` and
  `run.log(step, train_loss=loss.item())`, as a rank without a Monitor uses it.

Every batch is a function of (seed, step) and the same in every arm; the initial weights are a
function of the seed.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "tinyshakespeare.txt"
D_MODEL, LAYERS, HEADS, BLOCK, BATCH, VAL_WINDOWS = 64, 2, 2, 64, 16, 64
BETAS, WEIGHT_DECAY, WARMUP_FRACTION, FLOOR = (0.9, 0.99), 0.1, 0.1, 0.1
ARMS = ("none", "palm", "skip", "guard")
PALM_BACK, PALM_MAX = 100, 20  # steps back a PaLM rewind reaches; rewinds before it stops rewinding

_IDS: Any = None  # the text's character ids, read once per process


@dataclass
class Outcome:
    """What one run ended with."""

    arm: str
    lr: float
    seed: int
    init_val: float  # the val loss before any update
    final_val: float  # NaN when the run ended non-finite
    rose: bool  # the train loss went non-finite or rose a nat above its lowest so far
    rescues: int = 0  # rewinds (palm, guard), skipped updates (skip)
    recomputed: int = 0  # updates undone by rewinds (their steps had to be taken again on new batches)
    skipped: int = 0  # batches whose update was never kept
    stopped: bool = False  # the guard stopped the run
    snapshot_bytes: int = 0
    state_bytes: int = 0  # the model's parameters and the optimizer's state, for scale
    weights: Any = field(default=None, repr=False)  # the final state dict when asked (the identity check)


def ids() -> Any:
    import torch
    global _IDS
    if _IDS is None:
        text = DATA.read_text(encoding="utf-8")
        chars = sorted(set(text))
        index = {c: i for i, c in enumerate(chars)}
        _IDS = torch.tensor([index[c] for c in text], dtype=torch.long)  # [chars]
    return _IDS


def vocab() -> int:
    return int(ids().max()) + 1


def batch(seed: int, step: int) -> tuple[Any, Any]:
    """[BATCH BLOCK] inputs and targets of the training split, a function of (seed, step)."""
    import torch
    data = ids()
    split = len(data) * 9 // 10
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(split - BLOCK - 1, (BATCH,), generator=g)
    rows = torch.stack([data[s:s + BLOCK + 1] for s in starts])  # [batch block+1]
    return rows[:, :-1], rows[:, 1:]


def val_windows() -> tuple[Any, Any]:
    import torch
    data = ids()
    split = len(data) * 9 // 10
    g = torch.Generator().manual_seed(7)
    starts = torch.randint(split, len(data) - BLOCK - 1, (VAL_WINDOWS,), generator=g)
    rows = torch.stack([data[s:s + BLOCK + 1] for s in starts])  # [windows block+1]
    return rows[:, :-1], rows[:, 1:]


def build(seed: int) -> Any:
    """A GPT-style transformer of ours (LayerNorm, GELU, learned positions, no QK-norm)."""
    import torch
    from models import build_model
    from models.config import TransformerConfig

    torch.manual_seed(seed)
    cfg = TransformerConfig(d_vocab=vocab(), n_ctx=BLOCK, d_model=D_MODEL, n_layers=LAYERS, n_heads=HEADS,
                            d_head=D_MODEL // HEADS, d_mlp=4 * D_MODEL, act_fn="gelu", attn_scale="sqrt_d_head",
                            norm="layer", final_norm=True, init="gpt")
    return build_model(cfg).train()


def schedule(steps: int):
    """Linear warmup over the first tenth, then cosine down to a tenth of the peak."""
    warmup = max(1, int(steps * WARMUP_FRACTION))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - 1 - warmup))
        return FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def val_loss(model: Any) -> float:
    import torch
    import torch.nn.functional as F
    x, y = val_windows()
    with torch.no_grad():
        model.eval()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
        model.train()
    return loss


def train(arm: str, lr: float, seed: int, steps: int, guard_options: dict[str, Any] | None = None,
          keep_weights: bool = False) -> Outcome:
    """One run of `arm` at peak rate `lr`; its Outcome."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    model = build(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(steps))
    out = Outcome(arm, lr, seed, init_val=val_loss(model), final_val=math.nan, rose=False)
    watcher = ARM_WATCHERS[arm](model, optimizer, guard_options or {})
    lowest = math.inf
    for step in range(steps):
        x, y = batch(seed, step)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        value = loss.item()
        out.rose |= not math.isfinite(value) or value > lowest + 1.0
        lowest = min(lowest, value)
        if watcher.before_step(step, value):
            optimizer.step()
        scheduler.step()
        if watcher.after_step(step, value):
            break  # the guard stopped the run: it holds its last good state
    out.final_val = val_loss(model)
    watcher.report(out)
    out.state_bytes = sum(t.numel() * t.element_size() for t in model.parameters()) + sum(
        v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
        if isinstance(v, torch.Tensor))
    if keep_weights:
        out.weights = {k: v.clone() for k, v in model.state_dict().items()}
    return out


class Bare:
    """The none arm: every update is taken, nothing is watched."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        self.model, self.optimizer = model, optimizer

    def before_step(self, step: int, loss: float) -> bool:
        return True

    def after_step(self, step: int, loss: float) -> bool:
        return False

    def report(self, out: Outcome) -> None:
        pass


class SkipStep(Bare):
    """OLMo-core's rule: skip the update when the loss or gradient norm is > 6 sigma off its mean."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        super().__init__(model, optimizer, options)
        self.losses: deque = deque(maxlen=129)
        self.norms: deque = deque(maxlen=129)
        self.skips = 0

    def before_step(self, step: int, loss: float) -> bool:
        import torch
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), math.inf))
        self.losses.append(loss)
        self.norms.append(norm)
        take = len(self.losses) < 64 or (self.calm(self.losses) and self.calm(self.norms))
        self.skips += not take
        return take

    @staticmethod
    def calm(values: deque) -> bool:
        past = list(values)[:-1]
        mean, std = statistics.fmean(past), statistics.pstdev(past)
        z = abs(values[-1] - mean) / std if std > 0 else (0.0 if values[-1] == mean else math.inf)
        return z <= 6.0  # a NaN compares False: skipped, as OLMo-core's tensor comparison does

    def report(self, out: Outcome) -> None:
        out.rescues = out.skipped = self.skips


class PaLM(Bare):
    """Rewind ~100 steps on a spike, skip the batches in between, keep the rate."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        from train.guard import Guard
        from train.guard.loss_watch import LossWatch
        from train.guard.snapshot import HostSnapshot

        super().__init__(model, optimizer, options)
        g = Guard(**options)
        self.every = g.every
        self.watch = LossWatch(window=g.window, sigma=g.sigma, min_rise=g.min_rise, patience=g.patience)
        self.slots = [HostSnapshot() for _ in range(g.keep)]
        self.slots[0].take(-1, model, optimizer)  # the start, as the guard holds it: where an early blow-up goes back
        self.kept, self.rewinds, self.undone = 0, 0, 0

    def after_step(self, step: int, loss: float) -> bool:
        why = self.watch.see(step, loss) if self.rewinds < PALM_MAX else None
        held = [s for s in self.slots if s.step is not None]
        if why is None:
            if step - self.kept >= self.every and self.watch.calm(step):
                slot = next((s for s in self.slots if s.step is None), None) or min(held, key=lambda s: s.step)
                slot.take(step, self.model, self.optimizer)
                self.kept = step
            return False
        back = [s for s in held if s.step <= step - PALM_BACK]
        slot = max(back, key=lambda s: s.step) if back else min(held, key=lambda s: s.step)
        slot.restore(self.model, self.optimizer)
        self.rewinds += 1
        self.undone += step - slot.step
        self.watch.rewound(slot.step)
        return False

    def report(self, out: Outcome) -> None:
        out.rescues, out.recomputed, out.skipped = self.rewinds, self.undone, self.undone
        out.snapshot_bytes = sum(s.nbytes for s in self.slots)


class Guarded(Bare):
    """The guard, as a rank without a Monitor runs it."""

    def __init__(self, model: Any, optimizer: Any, options: dict[str, Any]):
        from train.guard import Guard
        super().__init__(model, optimizer, options)
        self.run = Guard(**options).attach(model, optimizer)

    def after_step(self, step: int, loss: float) -> bool:
        from train.guard import GuardStop
        try:
            self.run.log(step, train_loss=loss)
        except GuardStop:
            return True
        return False

    def report(self, out: Outcome) -> None:
        rewinds = [r for r in self.run.rescues if r["action"] == "rewind"]
        out.rescues, out.recomputed, out.skipped = len(rewinds), self.run.undone, self.run.undone
        out.stopped, out.snapshot_bytes = self.run.stopped, self.run.snapshot_bytes
        self.run.close()


ARM_WATCHERS = {"none": Bare, "palm": PaLM, "skip": SkipStep, "guard": Guarded}
