"""The numbers a learning-rate sweep is summarised by, read from its runs' own files. Torch-free,
like the doctor: `train.sweep` writes them into sweep.json as runs finish, `probes.sweep` and the
app read them back.

    lr_sensitivity([3.0, 2.0, None, 2.5], [4.0] * 4)       # 0.875 nats (None: diverged)
    stable_range([1e-3, 1e-2, 1e-1, 1], [False, False, True, False])
    # {'lo': 0.001, 'hi': 0.01, 'decades': 1.0, 'rates': 2}

LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities"): over the swept rates, the mean of min(loss(lr), loss_init) minus the best of those
values, where a diverged run counts as loss_init. 0 means every rate reached the best loss; a run
that learned nothing adds its whole distance to the best.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from models.store.run import read_metrics, read_run_json
from probes.doctor.diagnosis import run as diagnose
from probes.doctor.rescues import rewound, stopped

__all__ = ["LOSS_KEYS", "SWEEP_FILE", "first_nonfinite_step", "is_finite", "lr_sensitivity",
           "run_finished", "run_outcome", "stable_range", "unstable", "variant_summary"]

SWEEP_FILE = "sweep.json"
LOSS_KEYS = ("train_loss", "val_loss")  # a record where one of these is NaN/inf (null) diverged
STABLE_ENDS_AT = "failed"  # the doctor's verdict that ends a stable range, as a divergence does


def is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ------------------------------------------------------------------ the two summaries (pure)


def lr_sensitivity(losses: Sequence[float | None], inits: Sequence[float | None]) -> float | None:
    """Mean over rates of min(loss, init) minus the smallest such value; a loss of None (diverged,
    or no final loss) counts as its run's init. None when a run has no init loss to compare with."""
    if not losses or len(losses) != len(inits) or not all(is_finite(i) for i in inits):
        return None
    clipped = [init if not is_finite(loss) else min(loss, init) for loss, init in zip(losses, inits)]
    return sum(clipped) / len(clipped) - min(clipped)


def stable_range(rates: Sequence[float], diverged: Sequence[bool]) -> dict[str, Any] | None:
    """The longest run of consecutive rates (sorted ascending) that did not diverge: its lowest and
    highest rate, its width in decades (log10 hi/lo) and how many rates it spans. Ties go to the
    wider range in decades, then to the lower rates. None when every rate diverged."""
    pairs = sorted(zip(rates, diverged))
    best: tuple[int, float, int, int] | None = None  # (count, decades, -start, end)
    start = None
    for i, (_, bad) in enumerate([*pairs, (math.inf, True)]):
        if not bad and start is None:
            start = i
        elif bad and start is not None:
            width = math.log10(pairs[i - 1][0] / pairs[start][0])
            key = (i - start, width, -start, i - 1)
            best = key if best is None or key[:3] > best[:3] else best
            start = None
    if best is None:
        return None
    count, decades, first, last = best[0], best[1], -best[2], best[3]
    return {"lo": pairs[first][0], "hi": pairs[last][0], "decades": decades, "rates": count}


# ------------------------------------------------------------------ one run, from its files


def first_nonfinite_step(records: Sequence[dict[str, Any]]) -> int | None:
    """The step of the first record the trainer marked diverged or whose train or val loss is
    NaN/inf (written as null); a step the guard rewound is not one (the run went on)."""
    for r in records:
        if rewound(r):
            continue
        if r.get("diverged") or any(k in r and not is_finite(r[k]) for k in LOSS_KEYS):
            return r["step"]
    return None


def run_outcome(run_dir: str | Path) -> dict[str, Any]:
    """What a sweep records of one run: planned and last step, the val loss at init, at the end
    (None when the last record has no finite one: a diverged run) and at its best, where it
    diverged (the first non-finite record, else the doctor's divergence finding; where the guard
    stopped it), the guard's rescues when it had any, and the doctor's verdict and findings' codes."""
    records = read_metrics(run_dir)
    info = read_run_json(run_dir) or {}
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    finite = [v for _, v in val if is_finite(v)]
    last = records[-1] if records else {}
    out: dict[str, Any] = {
        "steps": (info.get("train") or {}).get("steps"), "last_step": last.get("step"),
        "init_val_loss": next((v for s, v in val if s == 0 and is_finite(v)), None),
        "final_val_loss": last.get("val_loss") if is_finite(last.get("val_loss")) else None,
        "best_val_loss": min(finite) if finite else None,
        "keep_going": "--keep-going" in (info.get("argv") or [])}
    rescues = sum(1 for r in records if rewound(r))
    if rescues:  # a guarded run (--guard) that needed its guard
        out["rescues"] = rescues
    out.update(doctor_outcome(run_dir, first_nonfinite_step(records)))
    stop = next((r["step"] for r in records if stopped(r)), None)
    if stop is not None:  # the guard gave up on it: a divergence, however it showed
        out.update(diverged_by="guard", diverged_at=stop if out["diverged_at"] is None else out["diverged_at"])
    return out


def doctor_outcome(run_dir: str | Path, nonfinite: int | None) -> dict[str, Any]:
    """The doctor's verdict and codes, and the divergence step: non-finite first, the doctor's next."""
    try:
        found = diagnose(run_dir)
    except ValueError:  # too little history to diagnose (a run that failed at its start)
        return {"diverged_at": nonfinite, "diverged_by": "nonfinite" if nonfinite is not None else None,
                "verdict": None, "findings": []}
    codes = list(dict.fromkeys(f.code for f in found.findings))
    doctor = next((f.step for f in found.findings if f.code == "divergence"), None)
    at, by = (nonfinite, "nonfinite") if nonfinite is not None else (doctor, "doctor" if doctor is not None else None)
    return {"diverged_at": at, "diverged_by": by, "verdict": found.verdict, "findings": codes}


def run_finished(outcome: dict[str, Any]) -> bool:
    """A run whose metrics reach its last step, or that diverged and stopped there (no --keep-going),
    or that the guard stopped."""
    steps, last = outcome.get("steps"), outcome.get("last_step")
    if isinstance(steps, int) and isinstance(last, int) and last >= steps:
        return True
    return outcome.get("diverged_by") in ("nonfinite", "guard") and not outcome.get("keep_going")


# ------------------------------------------------------------------ one variant


def unstable(run: dict[str, Any]) -> bool:
    """A run that ends a stable range: it diverged, or the doctor calls it failed (an attention
    collapse, a loss that ended above its start). Healthy and warning runs are inside a range."""
    return run.get("diverged_at") is not None or run.get("verdict") == STABLE_ENDS_AT


def variant_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A variant's finished runs summarised: LR sensitivity, widest stable range, best rate."""
    done = sorted((r for r in runs if r.get("status") == "finished"), key=lambda r: r["lr"])
    diverged = [r.get("diverged_at") is not None for r in done]
    losses = [None if bad else r.get("final_val_loss") for r, bad in zip(done, diverged)]
    good = [(loss, r["lr"]) for loss, r in zip(losses, done) if is_finite(loss)]
    best = min(good) if good else (None, None)
    return {"finished": len(done), "runs": len(runs), "complete": len(done) == len(runs),
            "lr_sensitivity": lr_sensitivity(losses, [r.get("init_val_loss") for r in done]),
            "stable_range": stable_range([r["lr"] for r in done], [unstable(r) for r in done]),
            "diverged": sum(diverged), "failed": sum(unstable(r) and not bad for r, bad in zip(done, diverged)),
            "best_lr": best[1], "best_val_loss": best[0]}
