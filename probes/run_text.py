"""The text a probe reads when it is given none: the run's own data, else the shipped Tiny Shakespeare.

`python -m probes.entropy --ckpt checkpoints/shakespeare_gpt` (no --text, --text-file or --data)
reads the data file the run's run.json records, split as training split it (the last
`val_fraction` of its tokens is the validation split), and samples seeded windows from that
split. A checkpoint that records no data (a lone snapshot, a nanoGPT ckpt.pt, a Hugging Face
directory) reads data/tinyshakespeare.txt, when its tokenizer can encode it.

Paths and fractions only (no torch): `probes.common.token_batches` reads, encodes and samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parent.parent
SHIPPED_TEXT = REPO / "data" / "tinyshakespeare.txt"
NO_INPUT = "give the input with --text, --text-file or --data"
VAL_FRACTION = 0.1  # train's default, and nanoGPT's split of its prepared data


ORIGINS = {"run": "the run's data", "given": "--data",
           "shipped": "the shipped text: this checkpoint records no data"}


@dataclass(frozen=True)
class DefaultText:
    path: Path
    origin: str  # run (its run.json's data) | given (--data) | shipped (data/tinyshakespeare.txt)
    val_fraction: float

    def describe(self, windows: int, n_ctx: int, seed: int) -> str:
        """One line: which text, which part of it, how many windows."""
        whose = ORIGINS[self.origin]
        part = (f"the validation split (last {self.val_fraction:.0%})" if self.val_fraction > 0
                else "all (the run held out no validation split)")
        what = f"{windows} random windows" if windows != 1 else "1 random window"
        return f"{what} of {n_ctx} tokens (seed {seed}) from {part} of {shown(self.path)} ({whose})"


def shown(path: Path) -> str:
    """The path relative to the working directory when inside it (as run.json records paths)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def recorded_data(snapshot_path: Path) -> Path | None:
    """The text the run holding this snapshot was trained on, where run.json says (relative to the
    working directory, the run, or this repository), or None if none is recorded or found."""
    from models.store.run import read_run_json, snapshot_step
    if snapshot_step(snapshot_path) is None:
        return None
    try:
        recorded = ((read_run_json(snapshot_path.parent) or {}).get("data") or {}).get("path")
    except ValueError:
        return None
    if not recorded:
        return None
    for candidate in (Path(recorded), snapshot_path.parent / recorded, REPO / recorded):
        if candidate.is_file():
            return candidate
    return None


def val_fraction(snap: Any) -> float:
    """The share of the tokens training held out, as the snapshot's training config records it."""
    recorded = ((getattr(snap, "meta", None) or {}).get("train_config") or {}).get("val_fraction")
    return float(recorded) if isinstance(recorded, (int, float)) and 0 <= recorded < 1 else VAL_FRACTION


def default_text(snap: Any) -> DefaultText | None:
    """The run's recorded data, else the shipped text; None where neither is here."""
    path = recorded_data(Path(snap.path)) if getattr(snap, "path", None) else None
    if path is not None:
        return DefaultText(path, "run", val_fraction(snap))
    return DefaultText(SHIPPED_TEXT, "shipped", val_fraction(snap)) if SHIPPED_TEXT.is_file() else None


def validation_split(ids: Sequence[int], fraction: float) -> Sequence[int]:
    """The last round(len * fraction) ids, as training holds them out; all of them for 0."""
    n_val = int(round(len(ids) * fraction))
    return ids[len(ids) - n_val:] if n_val else ids
