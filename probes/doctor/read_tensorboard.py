"""TensorBoard event files (`events.out.tfevents.*`) read into our records: the usual tags of
PyTorch's SummaryWriter loops, Hugging Face's TensorBoardCallback (`train/loss`, `eval/loss`, ...) and Lightning's TensorBoardLogger are mapped; `--tag NAME=ours`
maps any other. Lightning names a metric logged with `self.log("train_loss", ..., on_step=True,
on_epoch=True)` twice, `train_loss_step` (per step) and `train_loss_epoch` (at each epoch's last
step): the per-step one is read, the epoch means only where no per-step tag was written. Its
LearningRateMonitor writes `lr-<Optimizer>`; its `epoch` and `hp_metric` tags mark it as Lightning's.

The files are walked record by record here (probes.doctor.tfrecord), each record's CRC checked,
so that a damaged record is skipped and said, not the end of the history; the Event protobuf is
TensorBoard's. `tensorboard` is an optional dependency (`pip install 'scratchscope[tensorboard]'`),
imported only when event files are to be read. Scalars written as TensorBoard scalars and as tensors
(`tensorboard.summary.Writer`, tf.summary v2) are both read.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable

from probes.doctor.log_file import (Log, check_not_lfs_pointer, check_user_tags, kind_of_losses, merge_steps,
                                    require_loss, user_tags)
from probes.doctor.read_mirror import MIRROR, RUN_KEY, mirrored_fields, run_facts, with_run_facts
from probes.doctor.tfrecord import Damage, walk_records
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
    texts: dict[str, str] = {}
    series, skipped = read_scalars(path, texts)
    check_user_tags(path, given, series, "TensorBoard tag")
    mapping = {**TENSORBOARD_TAGS, **{t: "lr" for t in series if t.startswith("lr-")}}
    if any(t.endswith("_step") and mapping.get(t) for t in series):  # per-step values: not the epochs'
        mapping = {t: ours for t, ours in mapping.items() if not t.endswith("_epoch")}
    mapping.update(given)
    # later tags in the mapping overwrite earlier ones at a step: the user's --tag wins
    records = merge_steps([*mirrored_steps(series),
                           *((step, {ours: value}) for tag, ours in mapping.items() if tag in series
                             for step, value in series[tag])])
    require_loss(path, records, series, "TensorBoard tags")
    lightning = any(t in series for t in LIGHTNING_MARKS) or any(t.endswith(("_step", "_epoch")) for t in series)
    kind, why = kind_of_losses(records, series)
    found = Log(path, SOURCE, records, trainer="lightning" if lightning else "unknown", loss_kind=kind,
                loss_kind_why=why, skipped=skipped)
    return with_run_facts(found, run_facts(texts.get(RUN_KEY)))


def mirrored_steps(series: dict[str, list[tuple[int, float]]]) -> list[tuple[int, dict[str, Any]]]:
    """The Monitor's scratchscope/* scalars (train.monitor.wandb_mirror) as metrics.jsonl fields, per step."""
    rows: dict[int, dict[str, float]] = {}
    for tag, values in series.items():
        if tag.startswith(MIRROR):
            for step, value in values:
                rows.setdefault(step, {})[tag] = value
    return [(step, mirrored_fields(row)) for step, row in sorted(rows.items())]


def read_scalars(path: Path, texts: dict[str, str] | None = None) -> tuple[dict[str, list[tuple[int, float]]], int]:
    """({tag: [(step, value)]} of every scalar in the events, records skipped as damaged), the
    files read in name order (their names start with the time they were opened). A damaged record
    is skipped and the rest read (tfrecord.walk_records), with one warning per file saying what
    was lost; one-line errors for what cannot be read at all. `texts` gets the Monitor's text
    summaries (its run.json: probes.doctor.read_mirror), the last of each tag."""
    files = [path] if path.is_file() else event_files(path)
    for file in files:
        check_not_lfs_pointer(file)
    event_pb2 = event_proto()
    found: dict[str, list[tuple[int, float]]] = {}
    skipped, damaged = 0, []
    for file in files:
        damage = Damage()
        try:
            read_file_scalars(file, event_pb2, found, damage, texts)
        except OSError as err:
            raise ProbeInputError(f"{file}: cannot read the events ({err.strerror or err})") from None
        if damage.records == 0 and damage.any:
            damaged.append(f"{file.name} is not a TensorBoard event file: no TFRecord framing in its "
                           f"{damage.size} bytes" + (" (a text file named like one)" if looks_text(file) else ""))
            log.warning("%s: skipped: %s", path, damaged[-1])
            continue
        if damage.any:
            log.warning("%s: %s; read the %d records around it", file, damage.text(), damage.records)
            damaged.append(f"{file.name}: {damage.text()}")
        skipped += len(damage.bad_records) + len(damage.lost_bytes)
    found = {tag: series for tag, series in found.items() if series}
    if not found:
        why = f"no scalars read: {damaged[0]}" if damaged else "the TensorBoard events hold no scalars"
        raise ProbeInputError(f"{path}: {why}")
    return found, skipped


def read_file_scalars(file: Path, event_pb2: Any, found: dict[str, list[tuple[int, float]]], damage: Damage,
                      texts: dict[str, str] | None = None) -> None:
    """One event file's scalars added to `found`; a restart drops what it makes stale, as
    TensorBoard does: a SessionLog.START (file version 2) drops every tag's later steps, a step
    going back (older files) the later steps of the tags it logs."""
    plugins: dict[str, str] = {}  # tag -> plugin name, from the first value that carried metadata
    version, newest = 0.0, -1
    for event in walk_records(file, damage, lambda data: parse_event(event_pb2, data)):
        if event.HasField("file_version"):
            version = file_version(event.file_version)
        values = scalar_values(event, plugins)
        if version >= 2:
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                purge(found, found, event.step)
        elif event.step < newest and event.HasField("summary"):
            purge(found, [v.tag for v in event.summary.value], event.step)
        else:
            newest = event.step
        for tag, value in values.items():
            found.setdefault(tag, []).append((event.step, value))
        if texts is not None:
            texts.update(mirrored_texts(event, plugins))


def mirrored_texts(event: Any, plugins: dict[str, str]) -> dict[str, str]:
    """{tag: text} of the Monitor's text summaries in an event (SummaryWriter.add_text appends
    '/text_summary' to the tag)."""
    out = {}
    for v in event.summary.value:
        tag = v.tag.removesuffix("/text_summary")
        if tag.startswith(MIRROR) and plugins.get(v.tag) == "text" and v.tensor.string_val:
            out[tag] = v.tensor.string_val[0].decode("utf-8", "replace")
    return out


def parse_event(event_pb2: Any, data: bytes) -> Any:
    """An Event from a record's bytes, or None when it holds nothing the doctor reads (an image,
    a graph): its CRC is then not checked. ValueError when the bytes are no Event."""
    from google.protobuf.message import DecodeError
    event = event_pb2.Event()
    try:
        event.ParseFromString(data)
    except DecodeError:
        raise ValueError("not an Event") from None
    if event.HasField("summary"):
        return event if any(v.HasField("simple_value") or v.HasField("tensor") for v in event.summary.value) else None
    return event if event.HasField("file_version") or event.HasField("session_log") else None


def scalar_values(event: Any, plugins: dict[str, str]) -> dict[str, float]:
    """{tag: value} of an event's scalars: simple values, and one-element tensors of the scalars
    plugin (tf.summary v2, tensorboard.summary.Writer; their metadata comes with the first)."""
    out = {}
    for v in event.summary.value:
        if v.metadata.plugin_data.plugin_name:
            plugins.setdefault(v.tag, v.metadata.plugin_data.plugin_name)
        if v.HasField("simple_value"):
            out[v.tag] = float(v.simple_value)
        elif v.HasField("tensor") and plugins.get(v.tag) == "scalars":
            value = tensor_value(v.tensor)
            if value is not None:
                out[v.tag] = value
    return out


def purge(found: dict[str, list[tuple[int, float]]], tags: Iterable[str], step: int) -> None:
    for tag in list(tags):
        if tag in found:
            found[tag] = [(s, v) for s, v in found[tag] if s < step]


def file_version(text: str) -> float:
    """'brain.Event:2' -> 2.0; 0 when unreadable."""
    try:
        return float(text.rpartition(":")[2])
    except ValueError:
        return 0.0


def looks_text(file: Path) -> bool:
    with file.open("rb") as f:
        head = f.read(512)
    return bool(head) and b"\0" not in head


def event_proto() -> Any:
    try:
        from tensorboard.compat.proto import event_pb2
    except ImportError:
        raise ProbeInputError("reading TensorBoard event files needs tensorboard: "
                              "pip install 'scratchscope[tensorboard]'") from None
    return event_pb2


def tensor_value(proto: Any) -> float | None:
    """A one-element tensor's value as a float; None for any other tensor."""
    from tensorboard.util import tensor_util
    try:
        array = tensor_util.make_ndarray(proto)
    except (ValueError, TypeError):
        return None
    return float(array.item()) if array.size == 1 and array.dtype.kind in "fiub" else None
