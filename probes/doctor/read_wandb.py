"""A Weights & Biases run folder (`wandb/run-<date>-<id>/` or `wandb/offline-run-...`, or the
`wandb/` folder above them: its `latest-run`) read into our records, without wandb.

The history is in `run-<id>.wandb` (probes.doctor.wandb_file: its framing and a protobuf wire
decoder); from each protobuf `Record` only these fields are read (numbers from wandb's
wandb_internal.proto): Record.history = 2, .config = 5, .run = 17; HistoryRecord.item = 1;
HistoryItem/ConfigItem .key = 1, .nested_key = 2, .value_json = 16 (a float `number` = 6 where a
writer used it); ConfigRecord.update = 1; RunRecord.config = 4.

The step axis is the run's own: `iter` (nanoGPT), `step` (nanochat), `train/global_step` (the
Hugging Face Trainer), whichever is logged, never W&B's row counter `_step` then. A run resumed
under the same id writes a new folder each time: they are merged by step, a later folder's
records replacing the earlier ones from its first step on. A run folder without its .wandb file
is read from `files/wandb-summary.json` (the last values: one record) and says so.
"""

from __future__ import annotations

import json
import logging
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from probes.doctor.log_file import Log, check_user_tags, is_number, kind_of_losses, require_loss, user_tags
from probes.doctor.read_mirror import MIRROR, RUN_KEY, mirrored_fields, run_facts, with_run_facts
from probes.doctor.wandb_file import Walk, message_fields, walk_wandb_records
from probes.errors import ProbeInputError

__all__ = ["MIRROR", "MIRROR_STEP", "SOURCE", "STEP_KEYS", "WANDB_KEYS", "find_wandb_run", "read_wandb", "read_wandb_file"]

log = logging.getLogger(__name__)

RUN_DIR = re.compile(r"^(?:offline-)?run-(\d{8}_\d{6})-([A-Za-z0-9]+)$")
SUMMARY_FILE, CONFIG_FILE = "files/wandb-summary.json", "files/config.yaml"
# the run's own step key, by trainer: nanoGPT's train.py, nanochat's scripts, the Trainer's WandbCallback
STEP_KEYS = {"iter": "nanogpt", "step": "unknown", "train/global_step": "hf"}
MIRROR_STEP = MIRROR + "step"  # the Monitor's step of the mirror's keys in a row: they join the user's rows
SOURCE = "the W&B run"  # how the doctor names one, before its folder's name
W_STEP = "_step"  # W&B's own row counter: the axis only when the run logs none of STEP_KEYS
WANDB_KEYS = {MIRROR + "grad_norm": "grad_norm",  # the Monitor's mirror (train.monitor.wandb_mirror); the user's own wins
              "train/loss": "train_loss", "loss": "train_loss", "train_loss": "train_loss",
              "val/loss": "val_loss", "eval/loss": "val_loss", "eval_loss": "val_loss", "val_loss": "val_loss",
              "lr": "lr", "learning_rate": "lr", "train/learning_rate": "lr", "train/lr": "lr",
              "grad_norm": "grad_norm", "train/grad_norm": "grad_norm", "train/gradient_norm": "grad_norm",
              "val/bpb": "val_bpb",  # nanochat's: bits per byte, not nats, so never a val_loss
              "train/lrm": "lr_multiplier"}  # nanochat's schedule multiplier: times matrix_lr is a rate
# our config names <- the names nanoGPT's, nanochat's and a Hugging Face config give them
CONFIG_NAMES = {"model": {"d_vocab": ("vocab_size",), "n_ctx": ("block_size", "max_seq_len", "n_positions"),
                          "n_layers": ("n_layer", "depth", "num_hidden_layers"), "n_heads": ("n_head",),
                          "d_model": ("n_embd", "hidden_size")},
                "train": {"steps": ("max_iters", "num_iterations", "max_steps"),
                          "lr": ("learning_rate", "matrix_lr"), "grad_clip": ("grad_clip", "max_grad_norm"),
                          "log_every": ("log_interval", "logging_steps")}}
# the history rows, config updates and the run's first config; not Record.summary (3): wandb writes one
# after each row, and the summary is read only for a folder without its .wandb (wandb-summary.json)
RECORD_FIELDS = frozenset({2, 5, 17})


@dataclass
class Segment:
    """One run folder's reading: its history rows, config and summary, and how the walk went."""

    folder: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    walk: Walk = field(default_factory=Walk)
    bad: int = 0  # records whose bytes were no protobuf message
    has_file: bool = True


def is_run_folder(folder: Path) -> bool:
    return bool(RUN_DIR.match(folder.name)) and folder.is_dir() and (
        any(folder.glob("run-*.wandb")) or (folder / SUMMARY_FILE).is_file())


def find_wandb_run(folder: Path) -> Path | None:
    """The W&B run folder `folder` is or names: itself, or in a `wandb/` folder the run its
    `latest-run` link points to (else the newest run folder, the others named); None if neither."""
    if is_run_folder(folder.resolve()):  # latest-run is a link to one
        return folder.resolve()
    latest = folder / "latest-run"
    if latest.is_dir() and is_run_folder(latest.resolve()):
        return latest.resolve()
    runs = sorted((p for p in folder.glob("*run-*") if is_run_folder(p)), key=lambda p: RUN_DIR.match(p.name)[1])
    if len(runs) > 1:
        log.info("%s: %d W&B runs and no latest-run; reading the newest, %s (give its folder to read another)",
                 folder, len(runs), runs[-1].name)
    return runs[-1] if runs else None


def read_wandb_file(path: Path, tags: Iterable[str] | dict[str, str] | None = None) -> Log:
    """A `run-<id>.wandb` file named by itself (--log): read with its folder."""
    return read_wandb(path.parent if is_run_folder(path.parent) else path, tags)


def read_wandb(path: Path, tags: Iterable[str] | dict[str, str] | None = None) -> Log:
    """A W&B run folder (with the folders of its resumes), or one .wandb file, as a Log."""
    folders = segments_of(path) if path.is_dir() else [path]
    segments = [read_segment(p) for p in folders]
    rows = [row for s in segments for row in s.rows]
    summary_only = not any(s.has_file for s in segments)
    if summary_only:
        rows = [segments[-1].summary] if segments[-1].summary else []
    if not rows:
        raise ProbeInputError(f"{path}: no history logged in the W&B run yet")
    step_key = next((k for k in STEP_KEYS if any(k in r for r in rows)), W_STEP)
    names = {k for r in rows for k in r}
    users = {k for k in names if not k.startswith(("_", MIRROR))}  # not W&B's own, nor the Monitor's mirror
    given = user_tags(tags)
    check_user_tags(path, given, names, "W&B key")
    config = {k: v for s in segments for k, v in s.config.items()}
    records = merged(segments, step_key, {**WANDB_KEYS, **given}, summary_only)
    lr_from_multiplier(records, config)
    require_steps(path, rows, records, step_key)
    require_loss(path, records, users, "W&B keys")
    kind, why = kind_of_losses(records, users)
    walks = [s.walk for s in segments]
    skipped = sum(w.damaged for w in walks) + sum(s.bad for s in segments)
    for s in segments:
        if s.walk.damaged or s.bad:
            log.warning("%s: %s", s.folder, s.walk.damaged_text() or f"{s.bad} records that are no protobuf skipped")
    model, train = config_facts(config)
    found = Log(path, source_text(path, segments, step_key, records, summary_only), records, model, train,
                STEP_KEYS.get(step_key, "unknown"), kind, why, skipped=skipped)
    return with_run_facts(found, run_facts(config.get(RUN_KEY)))


def segments_of(folder: Path) -> list[Path]:
    """The run folder and those of the same run id beside it (each resume writes one), oldest first."""
    match = RUN_DIR.match(folder.name)
    if match is None:
        return [folder]
    same = [p for p in folder.parent.glob(f"*run-*-{match[2]}") if (m := RUN_DIR.match(p.name)) and m[2] == match[2]
            and is_run_folder(p)]
    return sorted(same or [folder], key=lambda p: RUN_DIR.match(p.name)[1])


def read_segment(path: Path) -> Segment:
    folder = path.parent if path.is_file() else path
    files = [path] if path.is_file() else sorted(folder.glob("run-*.wandb"))
    segment = Segment(folder, has_file=bool(files))
    for file in files:
        try:
            for data in walk_wandb_records(file, segment.walk):
                try:
                    read_record(data, segment)
                except ValueError:
                    segment.bad += 1
        except OSError as err:
            raise ProbeInputError(f"{file}: cannot read ({err.strerror or err})") from None
        if segment.walk.cut_at is not None:  # a run still writing: what came before is the history
            log.info("%s: ends inside a record at byte %d (a run still writing?); read the %d before it",
                     file, segment.walk.cut_at, segment.walk.records)
    if not segment.has_file:  # the history holds what the summary says: read only without it
        segment.summary = summary_json(folder)
    if not segment.config:
        segment.config = config_yaml(folder)
    return segment


def read_record(data: bytes, segment: Segment) -> None:
    """One Record's history row or config update (ValueError: not a protobuf message)."""
    record = message_fields(data, RECORD_FIELDS)
    for body in record.get(2, ()):
        segment.rows.append(items(body))
    for body in record.get(5, ()):
        segment.config.update(items(body))
    for body in record.get(17, ()):
        for config in message_fields(body, frozenset({4})).get(4, ()):
            segment.config.update(items(config))


def items(body: bytes) -> dict[str, Any]:
    """{key: value} of a history, summary or config message's items (field 1 of each); a nested
    key joins with '.', as W&B shows it; a value is its JSON (NaN, Infinity as JSON writes them)."""
    out = {}
    for raw in message_fields(body, frozenset({1})).get(1, ()):
        item = message_fields(raw, frozenset({1, 2, 6, 16}))
        key = b".".join(item.get(2) or item.get(1) or [b""]).decode("utf-8", "replace")
        if 16 in item:
            out[key] = json_value(item[16][-1])
        elif 6 in item and len(item[6][-1]) == 8:
            out[key] = struct.unpack("<d", item[6][-1])[0]
    return out


JSON_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def json_value(raw: bytes) -> Any:
    """A value's JSON: a number as JSON writes one (most are) through float() at C speed (float()
    alone would take "4_0" or " 40"), anything else through json (NaN, Infinity as W&B writes
    them); None when it is no JSON, or nested past what Python's json reads (RecursionError)."""
    if JSON_NUMBER.fullmatch(raw):
        return float(raw)
    try:
        return json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None


def merged(segments: list[Segment], step_key: str, mapping: dict[str, str], summary_only: bool) -> list[dict[str, Any]]:
    """One record per step in our names; a later segment's steps replace the earlier ones' from its
    first step on (a resume redoes them); rows without the step key are left out (counted)."""
    by_step: dict[int, dict[str, Any]] = {}
    missing = 0
    for segment in segments:
        rows = [segment.summary] if summary_only else segment.rows
        mine: dict[int, dict[str, Any]] = {}
        for row in rows:
            for step, names, mirrored in row_steps(row, step_key, mapping):
                if step is None:
                    missing += 1
                    continue
                values = {ours: float(v) for name, ours in names.items() if is_number(v := row.get(name))}
                if mirrored:  # the Monitor's readings at their own step; the user's own names win
                    values = {**mirrored_fields(row), **values}
                if values:
                    mine.setdefault(step, {"step": step}).update(values)
        if mine:
            first = min(mine)
            by_step = {s: r for s, r in by_step.items() if s < first}
            by_step.update(mine)
    if missing:
        log.info("W&B run: %d history rows without %s left out", missing, step_key)
    return [by_step[s] for s in sorted(by_step)]


def row_steps(row: dict[str, Any], step_key: str,
              mapping: dict[str, str]) -> list[tuple[int | None, dict[str, str], bool]]:
    """A row's (step, names read at it, whether the Monitor's readings are at that step): the Monitor's
    keys at its own step where the row holds it (they join whichever row the user logs,
    train.monitor.wandb_mirror), the user's at their step key; an older mirror's rows: all at the user's."""
    if MIRROR_STEP not in row:
        return [(step_of(row.get(step_key)), mapping, True)]
    ours = {name: v for name, v in mapping.items() if name.startswith(MIRROR)}
    theirs = {name: v for name, v in mapping.items() if not name.startswith(MIRROR)}
    out = [(step_of(row[MIRROR_STEP]), ours, True)]
    if step_key in row or any(name in row for name in theirs):
        out.append((step_of(row.get(step_key)), theirs, False))
    return out


def require_steps(path: Path, rows: list[dict[str, Any]], records: list[dict[str, Any]], step_key: str) -> None:
    """A run whose step key never holds a step (strings, true, 10.5): said so, not "no loss"."""
    if any(key in r for r in records for key in ("train_loss", "val_loss")):
        return
    bad = [r[step_key] for r in rows if step_key in r and step_of(r[step_key]) is None]
    if bad:
        shown = ", ".join(json.dumps(v)[:20] if v is None or isinstance(v, (str, int, float)) else f"a JSON {type(v).__name__}"
                          for v in bad[:3])
        raise ProbeInputError(f"{path}: its step key {step_key} holds no whole step number (it has: {shown}); "
                              f"log {step_key} as an integer, e.g. wandb.log({{'{step_key}': int(step), ...}})")


def step_of(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value) if value >= 0 and value == int(value) else None


def lr_from_multiplier(records: list[dict[str, Any]], config: dict[str, Any]) -> None:
    """nanochat logs its schedule's multiplier (train/lrm), its Muon matrices' rate being
    matrix_lr times it: the rate the advice speaks of, where the config gives matrix_lr."""
    base = plain(config.get("matrix_lr"))
    if not is_number(base):
        return
    for r in records:
        if "lr_multiplier" in r and "lr" not in r:
            r["lr"] = base * r["lr_multiplier"]


def plain(value: Any) -> Any:
    """A config value; config.yaml wraps each as {value: ..., desc: ...}."""
    return value.get("value") if isinstance(value, dict) and "value" in value else value


def config_facts(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model, train) facts in our names from the run's config."""
    out: dict[str, dict[str, Any]] = {"model": {}, "train": {}}
    for where, names in CONFIG_NAMES.items():
        for ours, theirs in names.items():
            value = next((v for n in theirs if is_number(v := plain(config.get(n))) and math.isfinite(v)), None)
            if value is not None and (value > 0 or ours == "grad_clip"):
                out[where][ours] = int(value) if where == "model" or ours in ("steps", "log_every") else float(value)
    return out["model"], out["train"]


def source_text(path: Path, segments: list[Segment], step_key: str, records: list[dict[str, Any]],
                summary_only: bool) -> str:
    """How the doctor names what it read: the run, its step key, its resumes, what it could not."""
    name = segments[-1].folder.name if path.is_dir() else path.name
    notes = [f"steps: {step_key}" if step_key != W_STEP else "steps: W&B's _step, no iter or step logged"]
    if len(segments) > 1:
        notes.append(f"{len(segments)} resumed folders merged")
    if summary_only:
        notes.append(f"no run-*.wandb file: its last values from {SUMMARY_FILE} only")
    if any("val_bpb" in r for r in records):
        notes.append("val/bpb in bits per byte, not nats")
    return f"{SOURCE} {name} ({'; '.join(notes)})"


def summary_json(folder: Path) -> dict[str, Any]:
    path = folder / SUMMARY_FILE
    if not path.is_file():  # a regular file only: never a FIFO's open
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ProbeInputError(f"{path}: not read (JSON nested deeper than Python's json reads)") from None
    except (OSError, ValueError) as err:
        raise ProbeInputError(f"{path}: not readable as JSON ({str(err).splitlines()[0]})") from None
    return found if isinstance(found, dict) else {}


MAX_DEPTH = 200  # a config's nesting, far past any trainer's


def flow_depth(text: str) -> int:
    """The deepest nesting of YAML's flow brackets ([ and {) in `text` (quotes not told apart)."""
    depth = deepest = 0
    for match in re.finditer(r"[\[\]{}]", text):
        depth = depth + 1 if match[0] in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def config_yaml(folder: Path) -> dict[str, Any]:
    """files/config.yaml (an online run's), read with PyYAML's safe loader where it is installed."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        import yaml
    except ImportError:
        log.info("%s: not read (PyYAML is not installed)", path)
        return {}
    try:
        text = path.read_text(encoding="utf-8")
        if flow_depth(text) > MAX_DEPTH:  # PyYAML would recurse to Python's limit (seconds), then fail
            raise ValueError(f"nested more than {MAX_DEPTH} deep")
        found = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError, RecursionError) as err:
        log.warning("%s: not read (%s)", path, (str(err).splitlines() or [type(err).__name__])[0])
        return {}
    return found if isinstance(found, dict) else {}
