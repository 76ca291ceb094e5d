"""What every history reader returns: a `Log`, the records of a file another trainer wrote, keyed
by our metrics.jsonl names (step, train_loss, val_loss, lr, grad_norm, ...), plus what the file
says about the model and the training. `RunHistory.from_log` turns one into a RunHistory.

Also the names a log's own tags may be mapped to (`--tag NAME=ours`), and the checks the readers
share: a log must give a loss somewhere, and a --tag the file lacks is named with what it has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from probes.errors import ProbeInputError

__all__ = ["KNOWN_NAMES", "LOSS_KINDS", "MAX_CROSS_ENTROPY", "Log", "is_number", "check_not_lfs_pointer", "check_user_tags",
           "kind_of_losses", "merge_steps", "parse_tag", "require_loss", "user_tags"]

# The scalar metrics.jsonl names the rules read, which a foreign tag may be mapped to.
KNOWN_NAMES = ("train_loss", "val_loss", "lr", "grad_norm", "logit_max", "tokens", "step_time_ms")
LOSSES = ("train_loss", "val_loss")


@dataclass
class Log:
    """One foreign log read into our records (one per step, oldest first)."""

    path: Path  # what was read: a file, or the folder of TensorBoard event files
    source: str  # how the doctor names it: "trainer_state.json", "the nanoGPT log train.log", ...
    records: list[dict[str, Any]]
    model: dict[str, Any] = field(default_factory=dict)  # our model config's names: d_vocab, n_ctx, ...
    train: dict[str, Any] = field(default_factory=dict)  # our training config's names: steps, lr, log_every
    trainer: str = "unknown"  # whose settings the fixes name (probes.doctor.flags.TRAINERS)
    loss_kind: str = "cross_entropy"  # or "preference", "policy", "regression" (LOSS_KINDS)
    loss_kind_why: str = ""  # what in the log says so ("it logs rewards/chosen")
    skipped: int = 0  # damaged or unreadable records left out (each file's warning says which)
    formats: dict[str, int] = field(default_factory=dict)  # a printed log's step lines of each trainer's
    # format, the one read first ({"llm.c": 40, "nanoGPT": 40}: probes.doctor.sources says it mixes them)
    info: dict[str, Any] | None = None  # run.json, where the Monitor mirrored it (probes.doctor.read_mirror)


# What a loss that is not a next-token cross-entropy is judged by (probes.doctor.rules_loss):
# a preference loss (DPO's -log sigmoid of a reward margin) or a regression's error, scale-free;
# a policy loss (GRPO's, PPO's: near 0 by construction, its sign the advantage's) not at all.
LOSS_KINDS = {"cross_entropy": "a next-token cross-entropy", "preference": "a preference loss (DPO-style)",
              "policy": "a policy-gradient loss (GRPO/PPO-style)", "regression": "a regression error"}
# A next-token cross-entropy starts near ln(vocab): even a 10^13-token vocabulary gives 30 nats,
# so a first loss above this is not one (a mean-squared error in the thousands).
MAX_CROSS_ENTROPY = 30.0



def is_number(value: Any) -> bool:
    """A number a log holds: an int or a float (NaN and inf included), never a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)

def kind_of_losses(records: list[dict[str, Any]], names: Iterable[str]) -> tuple[str, str]:
    """(loss kind, why) from the names a log holds: TRL's reward and KL keys mark a preference or
    policy loss, a name with 'mse'/'mae'/'rmse' a regression; else from the values (a first loss
    above MAX_CROSS_ENTROPY, or a negative one, is no cross-entropy)."""
    names = set(names)
    policy = sorted(n for n in names if n in ("kl", "objective/kl", "reward", "reward_std")
                    or n.startswith(("rewards/", "objective/")) and "chosen" not in n)
    preference = sorted(n for n in names if "chosen" in n or "rejected" in n)
    if preference:
        return "preference", f"it logs {', '.join(preference[:2])}"
    if policy:
        return "policy", f"it logs {', '.join(policy[:2])}"
    regression = sorted(n for n in names if any(part in ("mse", "mae", "rmse", "l1", "l2")
                                                for part in n.lower().replace("/", "_").split("_")))
    if regression:
        return "regression", f"it logs {regression[0]}"
    losses = [r[k] for r in records for k in LOSSES if isinstance(r.get(k), float) and r[k] == r[k]]
    if losses and losses[0] > MAX_CROSS_ENTROPY:
        return "regression", f"its first loss is {losses[0]:.4g}, above any next-token cross-entropy"
    if any(v < 0 for v in losses):
        return "policy", "its loss goes negative, which a cross-entropy cannot"
    return "cross_entropy", ""


def parse_tag(item: str) -> tuple[str, str]:
    """'Loss/train=train_loss' -> ('Loss/train', 'train_loss'); an unknown `ours` is refused
    naming the known ones."""
    name, sep, ours = item.rpartition("=")
    if not sep or not name or not ours:
        raise ProbeInputError(f"--tag {item!r}: expected NAME=ours, e.g. 'Loss/train=train_loss'")
    if ours not in KNOWN_NAMES:
        raise ProbeInputError(f"--tag {item!r}: {ours!r} is not a name the doctor reads; known: "
                              + ", ".join(KNOWN_NAMES))
    return name, ours


def user_tags(tags: Iterable[str] | dict[str, str] | None) -> dict[str, str]:
    """--tag values (`NAME=ours` strings, or a {NAME: ours} dict) as a checked {NAME: ours}."""
    items = [f"{name}={ours}" for name, ours in tags.items()] if isinstance(tags, dict) else list(tags or ())
    return dict(parse_tag(item) for item in items)


def check_user_tags(path: Path, user: dict[str, str], present: Iterable[str], what: str) -> None:
    """A --tag the file does not have is an error naming what it has (a typo, most likely)."""
    present = sorted(present)
    missing = [name for name in user if name not in present]
    if missing:
        raise ProbeInputError(f"{path}: no {what} {', '.join(map(repr, missing))} (--tag); it has: "
                              + (", ".join(present) or "none"))


def merge_steps(entries: Iterable[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """(step, values) pairs merged into one record per step, in step order; a later value of the
    same key wins (a resumed run logs some steps twice). Steps that gave no value are dropped."""
    merged: dict[int, dict[str, Any]] = {}
    for step, values in entries:
        if values:
            merged.setdefault(step, {"step": step}).update(values)
    return [merged[s] for s in sorted(merged)]


def require_loss(path: Path, records: list[dict[str, Any]], present: Iterable[str], what: str) -> None:
    """A log without any loss cannot be diagnosed: say so, listing the names the file has."""
    if not any(key in r for r in records for key in LOSSES):
        names = sorted(present)
        raise ProbeInputError(f"{path}: no loss among its {what} (it has: {', '.join(names) or 'none'}); "
                              "map one with --tag NAME=train_loss")


LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def check_not_lfs_pointer(path: Path) -> None:
    """A Git LFS pointer where the file should be (a clone made without git-lfs): say so, by name."""
    try:
        with path.open("rb") as f:
            head = f.read(len(LFS_POINTER))
    except OSError as err:
        raise ProbeInputError(f"{path}: cannot read ({err.strerror})") from None
    if head == LFS_POINTER:
        raise ProbeInputError(f"{path}: a Git LFS pointer, not the file: run git lfs pull")
