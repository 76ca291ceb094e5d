"""TensorBoard event files (`events.out.tfevents.*`) read with TensorBoard's own reader into our
records: the usual tags of PyTorch's SummaryWriter loops, Hugging Face's TensorBoardCallback
(`train/loss`, `eval/loss`, ...) and Lightning's TensorBoardLogger are mapped; `--tag NAME=ours`
maps any other. Lightning names a metric logged with `self.log("train_loss", ..., on_step=True,
on_epoch=True)` twice, `train_loss_step` (per step) and `train_loss_epoch` (at each epoch's last
step): the per-step one is read, the epoch means only where no per-step tag was written. Its
LearningRateMonitor writes `lr-<Optimizer>`; its `epoch` and `hp_metric` tags mark it as Lightning's.

`tensorboard` is an optional dependency (`pip install 'scratchscope[tensorboard]'`), imported
only when event files are to be read. Scalars written as TensorBoard scalars and as tensors
(`tensorboard.summary.Writer`, tf.summary v2) are both read.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Any, Iterable

from probes.doctor.log_file import (Log, check_not_lfs_pointer, check_user_tags, kind_of_losses, merge_steps,
                                    require_loss, user_tags)
from probes.errors import ProbeInputError

__all__ = ["EVENTS_PREFIX", "TENSORBOARD_TAGS", "find_event_folder", "read_tensorboard"]

log = logging.getLogger(__name__)

EVENTS_PREFIX = "events.out.tfevents."
SOURCE = "the TensorBoard log"
TENSORBOARD_TAGS = {
    "loss": "train_loss", "train/loss": "train_loss", "train_loss": "train_loss",
    "val/loss": "val_loss", "eval/loss": "val_loss", "eval_loss": "val_loss", "val_loss": "val_loss",
    "lr": "lr", "learning_rate": "lr", "train/learning_rate": "lr",
    "grad_norm": "grad_norm", "train/grad_norm": "grad_norm",
    # Lightning's self.log names (on_epoch=True adds _epoch, on_step=True _step) and its examples'
    "train_loss_epoch": "train_loss", "train_loss_step": "train_loss", "loss_step": "train_loss",
    "val_loss_epoch": "val_loss", "valid_loss": "val_loss", "ptl/val_loss": "val_loss", "ptl/train_loss": "train_loss",
}
# Lightning's marks: its TensorBoardLogger logs the epoch and hp_metric; the _step/_epoch suffixes
LIGHTNING_MARKS = ("epoch", "hp_metric")
SUBFOLDER_DEPTH = 2  # Hugging Face writes <output_dir>/runs/<date>/events...


def event_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob(EVENTS_PREFIX + "*") if p.is_file())


def find_event_folder(folder: Path, levels: int = SUBFOLDER_DEPTH) -> Path | None:
    """The folder holding the event files to read: `folder` itself, else the subfolder (up to
    `levels` down) written to last, each subfolder being one run; None if there are none."""
    if event_files(folder):
        return folder
    found = []
    for depth in range(1, levels + 1):
        for sub in folder.glob("/".join(["*"] * depth)):
            if sub.is_dir() and (files := event_files(sub)):
                found.append((max(f.stat().st_mtime for f in files), str(sub), sub))
    if len(found) > 1:
        log.info("%s: %d folders of TensorBoard events; reading the newest, %s", folder, len(found), max(found)[2])
    return max(found)[2] if found else None


def read_tensorboard(path: Path, tags: Iterable[str] | dict[str, str] | None = None) -> Log:
    """The scalars of a folder of event files (or of one event file) as a Log."""
    given = user_tags(tags)
    series = read_scalars(path)
    check_user_tags(path, given, series, "TensorBoard tag")
    mapping = {**TENSORBOARD_TAGS, **{t: "lr" for t in series if t.startswith("lr-")}}
    if any(t.endswith("_step") and mapping.get(t) for t in series):  # per-step values: not the epochs'
        mapping = {t: ours for t, ours in mapping.items() if not t.endswith("_epoch")}
    mapping.update(given)
    # later tags in the mapping overwrite earlier ones at a step: the user's --tag wins
    records = merge_steps((step, {ours: value}) for tag, ours in mapping.items() if tag in series
                          for step, value in series[tag])
    require_loss(path, records, series, "TensorBoard tags")
    lightning = any(t in series for t in LIGHTNING_MARKS) or any(t.endswith(("_step", "_epoch")) for t in series)
    kind, why = kind_of_losses(records, series)
    return Log(path, SOURCE, records, trainer="lightning" if lightning else "unknown", loss_kind=kind,
               loss_kind_why=why)


def read_scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of every scalar in the events; one-line errors for what cannot be read."""
    files = [path] if path.is_file() else event_files(path)
    for file in files:
        check_not_lfs_pointer(file)
    accumulator = event_accumulator()
    acc = accumulator.EventAccumulator(str(path), size_guidance={accumulator.SCALARS: 0, accumulator.TENSORS: 0})
    try:
        acc.Reload()
    except Exception as err:  # noqa: BLE001 (TensorBoard raises its own errors on damaged files)
        raise ProbeInputError(f"{path}: TensorBoard could not read the events ({type(err).__name__}: {err})") from None
    found = {tag: [(e.step, float(e.value)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    for tag in acc.Tags()["tensors"]:
        if acc.SummaryMetadata(tag).plugin_data.plugin_name == "scalars":
            found[tag] = [(e.step, tensor_value(e.tensor_proto)) for e in acc.Tensors(tag)]
    try:
        cut = [f.name for f in files if truncated(f)]
    except OSError as err:
        raise ProbeInputError(f"{path}: cannot read the events ({err.strerror})") from None
    if not found:
        why = (f"event file {cut[0]} is truncated or damaged and holds no scalars" if cut
               else "the TensorBoard events hold no scalars")
        raise ProbeInputError(f"{path}: {why}")
    if cut:
        log.warning("%s: event file %s ends in a truncated record (a run killed mid-write?); read the rest",
                    path, cut[0])
    return found


def event_accumulator() -> Any:
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        raise ProbeInputError("reading TensorBoard event files needs tensorboard: "
                              "pip install 'scratchscope[tensorboard]'") from None
    return event_accumulator


def tensor_value(proto: Any) -> float:
    from tensorboard.util import tensor_util
    return float(tensor_util.make_ndarray(proto).item())


def truncated(path: Path) -> bool:
    """Whether the file's last TFRecord is incomplete: each record is a u64 length, a u32 CRC,
    the data and a u32 CRC; walking the lengths finds a cut (the CRCs are TensorBoard's to check)."""
    size, offset = path.stat().st_size, 0
    with path.open("rb") as f:
        while offset < size:
            header = f.read(8)
            if len(header) < 8:
                return True
            offset += 8 + 4 + struct.unpack("<Q", header)[0] + 4
            f.seek(offset)
    return offset != size
