"""The cases of benchmarks/bench_guard.py's trouble table: what goes wrong in a run (the loop that
trains one case in one arm is benchmarks/guard_loop.py).

One small GPT of ours (2 layers, 64-d, 2 heads of 32, LayerNorm, GELU, no QK-norm) on Tiny
Shakespeare's characters, batch 16 x 64. Four recipes ("families"):

- adamw_warmup: AdamW (0.9, 0.99), weight decay 0.1, a tenth of the steps of linear warmup, then
  cosine down to a tenth;
- adamw_const: the same AdamW at a constant rate, no warmup;
- sgd: SGD with momentum 0.9, the warmup and cosine of adamw_warmup;
- adam_onecycle: Adam (0.9, 0.999) under torch's OneCycleLR (30% up, cosine down).

The kinds of trouble (`cases`), each beside what it is measured against:

- healthy: each family at its good rate (the reference of its blow-ups; a guard must leave it
  bitwise untouched);
- blowup: each family at 10x, 100x and 1000x its good rate (three decades above it);
- stall: adamw_const at 30x: an early blow-up, then the loss sits far above the best;
- garbage: adamw_warmup at its good rate, the batches of 5 steps from mid-run garbage (random
  tokens; the right inputs with their targets shuffled over the batch); against the clean run;
- shift: adamw_warmup at its good rate, the text upper-cased from mid-run, val on upper-cased text
  (a real change of data the run should learn); against the unguarded run;
- transient: adamw_warmup at its good rate, the rate x20 for 3 steps at mid-run (a spike the run
  recovers from by itself); against the clean run and the unguarded one;
- offlog: adamw_warmup at its good rate, the rate x30 from 3 steps past mid-run to the end (a
  blow-up that starts between the Monitor's log steps); against the clean run;
- llama: a Llama-style GPT (RMSNorm, SwiGLU, rotary positions, tied embeddings;
  tests/gpt_kit/llama.py) in the adamw_warmup recipe: healthy, at 10x and 100x, and with 5
  garbage batches; against its healthy run;
- phase: the attention-only model of `train.repetition` learning in-context repetition at half, one
  and two times its good rate: induction heads form within the run (benchmarks/guard_phase.py), a
  healthy fast change of attention; against itself unguarded, bitwise;
- hf: a transformers GPT-2 of the same size in a `Trainer` (AdamW, linear decay) at 0.1, where it
  blows up in its first logging window; against the Trainer at 3e-3.

Every batch is a function of (seed, step), the same in every arm; the initial weights of the seed.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guard_phase import GOOD_PHASE, PHASE_RATES

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data" / "tinyshakespeare.txt"
D_MODEL, LAYERS, HEADS, BLOCK, BATCH, VAL_WINDOWS = 64, 2, 2, 64, 16, 64
BETAS, WEIGHT_DECAY, WARMUP_FRACTION, FLOOR = (0.9, 0.99), 0.1, 0.1, 0.1
EVENT_STEPS, BUMP, BUMP_STEPS = 5, 20.0, 3  # garbage batches; the transient's rate bump and its length
OFFLOG, OFF_BY = 30.0, 3  # the offlog case's rate factor, from this many steps past mid-run (off a log step)
GOOD = {"adamw_warmup": 3e-3, "adamw_const": 3e-3, "sgd": 0.3, "adam_onecycle": 1e-2, "hf": 3e-3, "llama": 3e-3}
DECADES = (10.0, 100.0, 1000.0)
KINDS = ("healthy", "blowup", "stall", "garbage", "shift", "transient", "offlog", "llama", "phase", "hf")

_IDS: dict[bool, Any] = {}  # the text's character ids (upper-cased: True), read once per process


@dataclass(frozen=True)
class Case:
    """One run's trouble: its kind, recipe, peak rate and what happens to its data or rate."""

    kind: str
    family: str
    lr: float
    event: str = ""  # random_tokens | shuffled_labels | upper | rate_bump | "" (nothing)

    @property
    def name(self) -> str:
        what = f" {self.event}" if self.event else ""
        return f"{self.kind}: {self.family} {self.lr:g}{what}"

    def reference(self) -> Case:
        """The case this one is measured against: the family's healthy run (for shift: itself, unguarded)."""
        if self.kind in ("shift", "phase") or self.kind == "llama" and self.lr == GOOD["llama"] and not self.event:
            return self
        return Case("llama" if self.family == "llama" else "healthy", self.family, GOOD[self.family])


def cases() -> list[Case]:
    """Every case of the table, healthy ones first."""
    out = [Case("healthy", f, GOOD[f]) for f in GOOD]
    out += [Case("blowup", f, GOOD[f] * d) for f in ("adamw_warmup", "adamw_const", "sgd", "adam_onecycle")
            for d in DECADES]
    out.append(Case("stall", "adamw_const", GOOD["adamw_const"] * 30))
    good = GOOD["adamw_warmup"]
    out += [Case("garbage", "adamw_warmup", good, e) for e in ("random_tokens", "shuffled_labels")]
    out.append(Case("shift", "adamw_warmup", good, "upper"))
    out.append(Case("transient", "adamw_warmup", good, "rate_bump"))
    out.append(Case("offlog", "adamw_warmup", good, "rate_x30"))
    out += [Case("llama", "llama", GOOD["llama"] * d) for d in (1.0, 10.0, 100.0)]
    out.append(Case("llama", "llama", GOOD["llama"], "random_tokens"))
    out += [Case("phase", "phase", GOOD_PHASE * m) for m in PHASE_RATES]
    out.append(Case("hf", "hf", 0.1))
    return out


@dataclass
class Outcome:
    """What one run ended with."""

    case: Case
    arm: str
    seed: int
    init_val: float  # the val loss before any update
    final_val: float  # NaN when the run ended non-finite
    rose: bool = False  # the train loss went non-finite or rose a nat above its lowest so far
    rescues: int = 0  # actions taken (skips and rewinds; a skip-step arm's skipped updates)
    lost: int = 0  # batches whose update was not kept (skipped, or undone by a rewind)
    stopped: bool = False  # the arm stopped the run
    actions: str = ""  # what a guard did, in order (its records' kind/action), for the per-run table
    weights: str = ""  # a hash of the final weights: healthy runs compared bitwise across arms
    snapshot_bytes: int = 0
    state_bytes: int = 0  # the model's parameters and the optimizer's state, for scale
    seconds: float = 0.0
    error: str = ""  # what failed inside the arm (the run ended there)
    stories: list = field(default_factory=list)  # the doctor's (kind, action, cause, fix) per rescue of a guarded run
    state: Any = field(default=None, repr=False)  # the final state dict, when asked


# ------------------------------------------------------------------ data


def ids(upper: bool = False) -> Any:
    import torch
    if upper not in _IDS:
        text = DATA.read_text(encoding="utf-8")
        index = {c: i for i, c in enumerate(sorted(set(text)))}
        _IDS[upper] = torch.tensor([index[c] for c in (text.upper() if upper else text)], dtype=torch.long)  # [chars]
    return _IDS[upper]


def vocab() -> int:
    return int(ids().max()) + 1


def batch(case: Case, seed: int, step: int, steps: int) -> tuple[Any, Any]:
    """[BATCH BLOCK] inputs and targets of the training split for `step`, the case's event applied."""
    import torch
    mid = steps // 2
    data = ids(upper=case.event == "upper" and step >= mid)
    split = len(data) * 9 // 10
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(split - BLOCK - 1, (BATCH,), generator=g)
    rows = torch.stack([data[s:s + BLOCK + 1] for s in starts])  # [batch block+1]
    x, y = rows[:, :-1], rows[:, 1:]
    if mid <= step < mid + EVENT_STEPS and case.event == "random_tokens":
        x, y = torch.randint(vocab(), x.shape, generator=g), torch.randint(vocab(), y.shape, generator=g)
    elif mid <= step < mid + EVENT_STEPS and case.event == "shuffled_labels":
        y = y.flatten()[torch.randperm(y.numel(), generator=g)].view_as(y)
    return x, y


def val_windows(upper: bool = False) -> tuple[Any, Any]:
    import torch
    data = ids(upper)
    split = len(data) * 9 // 10
    g = torch.Generator().manual_seed(7)
    starts = torch.randint(split, len(data) - BLOCK - 1, (VAL_WINDOWS,), generator=g)
    rows = torch.stack([data[s:s + BLOCK + 1] for s in starts])  # [windows block+1]
    return rows[:, :-1], rows[:, 1:]


def val_loss(model: Any, case: Case) -> float:
    import torch
    import torch.nn.functional as F
    x, y = val_windows(upper=case.event == "upper")
    with torch.no_grad():
        was = model.training
        model.eval()
        out = model(x)
        logits = getattr(out, "logits", out)  # [windows block vocab]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()).item()
        model.train(was)
    return loss


def weights_hash(model: Any) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------ our loop


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


def build_llama(seed: int) -> Any:
    """A Llama-style GPT (RMSNorm, SwiGLU, rotary, tied; tests/gpt_kit/llama.py) of the same size."""
    import sys

    import torch
    sys.path.insert(0, str(REPO / "tests"))
    from gpt_kit import LlamaGPT

    torch.manual_seed(seed)
    return LlamaGPT(vocab=vocab(), d=D_MODEL, n_heads=HEADS, n_layers=LAYERS, max_seq_len=BLOCK).train()


def warmup_cosine(steps: int, case: Case):
    """Linear warmup over the first tenth, then cosine down to a tenth (the transient's bump on top)."""
    warmup, mid = max(1, int(steps * WARMUP_FRACTION)), steps // 2

    def factor(step: int) -> float:
        if step < warmup:
            f = (step + 1) / warmup
        else:
            progress = min(1.0, (step - warmup) / max(1, steps - 1 - warmup))
            f = FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress))
        f *= OFFLOG if case.event == "rate_x30" and step >= mid + OFF_BY else 1.0
        return f * (BUMP if case.event == "rate_bump" and mid <= step < mid + BUMP_STEPS else 1.0)
    return factor


def optimizer_and_schedule(case: Case, model: Any, steps: int) -> tuple[Any, Any]:
    import torch
    params = model.parameters()
    if case.family == "sgd":
        opt = torch.optim.SGD(params, lr=case.lr, momentum=0.9)
    elif case.family == "adam_onecycle":
        opt = torch.optim.Adam(params, lr=case.lr)
        return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=case.lr, total_steps=steps)
    else:
        opt = torch.optim.AdamW(params, lr=case.lr, betas=BETAS, weight_decay=WEIGHT_DECAY)
    factor = (lambda step: 1.0) if case.family == "adamw_const" else warmup_cosine(steps, case)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)
