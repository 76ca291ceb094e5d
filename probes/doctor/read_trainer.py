"""A Hugging Face `Trainer`'s history: `trainer_state.json`'s `log_history` (written in the output
directory by `save_state()` and in every `checkpoint-N/`), read into our records, with what a
`config.json` beside it says of the model.

One `log_history` entry is one `Trainer.log` call: the training entries (`loss`, `learning_rate`,
`grad_norm`) and the evaluation entries (`eval_loss`) of one step become one record. The run's
closing summary (`train_loss`: the mean over the whole run, `train_runtime`, ...) maps to nothing.
Note that the Trainer's `logging_nan_inf_filter` (on by default) replaces a NaN loss by the
window's mean: a diverged run shows as a NaN `grad_norm`, which the divergence rule reads too.
"""

from __future__ import annotations

import bisect
import json
import logging
import re
from itertools import chain, repeat
from pathlib import Path
from types import NoneType
from typing import Any, Callable, Iterable

import numpy as np

from probes.doctor.json_stream import MAX_INT_DIGITS, JsonStreamError, read_object_streaming
from probes.doctor.log_file import (Log, check_not_lfs_pointer, check_user_tags, kind_of_losses, require_loss,
                                    user_tags)
from probes.doctor.text_log import check_regular_file, text_encoding
from probes.doctor.thin_columns import Rows
from probes.doctor.thinning import Thinned
from probes.errors import ProbeInputError

__all__ = ["STATE_FILE", "TRAINER_KEYS", "find_trainer_state", "read_trainer_state"]

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
INT64 = (-(2**63), 2**63 - 1)
LONGEST = 10**MAX_INT_DIGITS  # an int this long or longer json_stream reads as a float
# log_history's keys -> ours
TRAINER_KEYS = {"loss": "train_loss", "eval_loss": "val_loss", "learning_rate": "lr",
                "grad_norm": "grad_norm", "num_input_tokens_seen": "tokens"}
# our model config's names <- a Hugging Face config.json's (GPT-2's first, then the common ones)
HF_MODEL_KEYS = {"d_vocab": ("vocab_size",), "n_ctx": ("n_positions", "n_ctx", "max_position_embeddings"),
                 "n_layers": ("n_layer", "num_hidden_layers"), "n_heads": ("n_head", "num_attention_heads"),
                 "d_model": ("n_embd", "hidden_size")}


def find_trainer_state(folder: Path) -> Path | None:
    """The newest trainer_state.json of a Trainer output directory (its own, written at the end,
    else that of the highest checkpoint-N/), or of a checkpoint-N/ folder itself; None if none."""
    if (folder / STATE_FILE).is_file():
        return folder / STATE_FILE
    numbered = [(int(m.group(1)), p) for p in folder.iterdir()
                if (m := CHECKPOINT_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return max(numbered)[1] / STATE_FILE if numbered else None


def read_trainer_state(path: Path, tags: Iterable[str] | dict[str, str] | None = None) -> Log:
    """trainer_state.json as a Log, its log_history streamed entry by entry (json_stream: the file
    is never whole in memory); ProbeInputError (one line naming the file) if unreadable."""
    check_regular_file(path, f"a Trainer's {STATE_FILE}")
    check_not_lfs_pointer(path)
    given = user_tags(tags)
    history = History({**TRAINER_KEYS, **given})
    state = read_json(path, history.add, history.add_many)
    history.present.discard("step")
    if "log_history" not in state or state["log_history"] is not True:
        raise ProbeInputError(f"{path}: no log_history list (not a Trainer's {STATE_FILE}?)")
    if not history.entries:
        raise ProbeInputError(f"{path}: log_history is empty: nothing logged yet "
                              f"(the Trainer logs every logging_steps={state.get('logging_steps')} steps)")
    check_user_tags(path, given, history.present, "log_history key")
    thinned = history.records.windows_text()
    records = history.records.finish()
    history.check(path, records)
    require_loss(path, records, history.present, "log_history keys")
    train = {key: state[name] for key, name in (("steps", "max_steps"), ("log_every", "logging_steps"))
             if isinstance(state.get(name), int) and state[name] > 0}
    kind, why = kind_of_losses(records, history.present)
    source = f"{STATE_FILE} ({thinned})" if thinned else STATE_FILE
    return Log(path, source, records, model_config(path.parent), train, "hf", kind, why,
               skipped=history.skipped_entries)


class History:
    """log_history's entries merged into one record per step as they stream past (a later value
    of the same key wins: a resumed run logs some steps twice), with what was not a number."""

    def __init__(self, mapping: dict[str, str]):
        self.mapping = mapping
        self.records = Thinned()
        self.present: set[str] = set()
        self.entries = 0
        self.skipped_entries = 0  # entries without a whole-number step
        self.not_numbers: dict[str, tuple[int, Any]] = {}  # key -> (count, first value) of non-numbers

    def add(self, entry: Any) -> None:
        self.entries += 1
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int) or isinstance(entry["step"], bool):
            self.skipped_entries += 1
            return
        self.present.update(entry)  # "step" is taken out once read
        values = {}
        mapping = self.mapping
        for key, value in entry.items():
            ours = mapping.get(key)
            if ours is None:
                continue
            if type(value) is float or type(value) is int:  # the hot path; bool is not int here
                values[ours] = float(value)
            elif (value := number(value)) is not None:
                values[ours] = value
            else:
                count, first = self.not_numbers.get(key, (0, entry[key]))
                self.not_numbers[key] = (count + 1, first)
        if values:
            self.put(entry["step"], values)

    def add_many(self, entries: list[Any]) -> None:
        """Entries in bulk, as add() of each gives: the hot path of a long log_history. When every
        entry is an object with a whole-number step and every mapped value present is a number,
        they are read by column (each run of entries with the same mapped keys one block);
        otherwise entry by entry."""
        columns = self.columns(entries)
        if columns is None:
            for entry in entries:
                self.add(as_streamed(entry))
            return
        steps, values, present = columns
        self.entries += len(entries)
        self.present.update(chain.from_iterable(entries))
        held = np.zeros(len(entries), dtype=np.int64)  # which mapped keys each entry has, as bits
        for bit, mask in enumerate(present.values()):
            held |= mask.astype(np.int64) << bit
        cuts = [0] + (np.flatnonzero(held[1:] != held[:-1]) + 1).tolist() + [len(entries)]
        for a, b in zip(cuts[:-1], cuts[1:]):
            names = [ours for ours, mask in present.items() if mask[a]]
            if names:
                self.put_rows(Rows(steps[a:b], {ours: values[ours][a:b] for ours in names}))

    def columns(self, entries: list[Any]) -> tuple[np.ndarray, dict, dict] | None:
        """(steps, {ours: values, NaN where absent}, {ours: present}) of entries that are all
        objects with a whole-number step (an int64) and numbers only for their mapped keys; None
        for any other list (read entry by entry: it warns and counts as add() does)."""
        if len(set(self.mapping.values())) < len(self.mapping) or set(map(type, entries)) != {dict}:
            return None  # (two keys mapped to one name: the later in each entry wins, entry by entry)
        steps = list(map(dict.get, entries, repeat("step")))
        if set(map(type, steps)) != {int} or not INT64[0] <= min(steps) <= max(steps) <= INT64[1]:
            return None
        values, present = {}, {}
        for key, ours in self.mapping.items():
            column = list(map(dict.get, entries, repeat(key)))
            kinds = set(map(type, column))
            if kinds == {NoneType}:
                if any(map(dict.__contains__, entries, repeat(key))):
                    return None  # a null
                continue
            if not kinds <= {float, int, NoneType}:
                return None
            has = np.fromiter(map(dict.__contains__, entries, repeat(key)), dtype=bool, count=len(entries))
            if NoneType in kinds and column.count(None) != len(entries) - int(has.sum()):
                return None  # a null among the numbers
            if int in kinds:
                column = [v if type(v) is not int else float(as_streamed(v)) for v in column]
            values[ours] = np.array(column, dtype=np.float64)
            present[ours] = has
        return np.array(steps, dtype=np.int64), values, present

    def put_rows(self, rows: Rows) -> None:
        """Rows put() one by one in effect: a stretch of steps after the last record, in order,
        appended as a block."""
        steps, n, i = rows.steps, len(rows), 0
        breaks = (np.flatnonzero(steps[1:] <= steps[:-1]) + 1).tolist() + [n]
        while i < n:
            records = self.records
            if not records or steps[i] > records[-1]["step"]:
                j = breaks[bisect.bisect_right(breaks, i)]
                records.extend(rows.part(i, j))
                i = j
            else:
                self.put(int(steps[i]), rows.values(i))
                i += 1

    def put(self, step: int, values: dict[str, float]) -> None:
        """Into the step-ordered records: appended, or merged into its step's record."""
        records = self.records
        if records and records[-1]["step"] == step:
            records[-1].update(values)
        elif not records or records[-1]["step"] < step:
            records.append({"step": step, **values})
        else:  # a step logged out of order (rare): found by bisection
            records.flush()
            i = bisect.bisect_left(records, step, key=lambda r: r["step"])
            if i < len(records) and records[i]["step"] == step:
                records[i].update(values)
            else:
                list.insert(records, i, {"step": step, **values})

    def check(self, path: Path, records: list[dict[str, Any]]) -> None:
        """A mapped key that never held a number is an error saying so; one that sometimes did, a
        warning; entries without a step, a warning."""
        if self.skipped_entries:
            log.warning("%s: skipped %d log_history entr%s without a whole-number step", path, self.skipped_entries,
                        "y" if self.skipped_entries == 1 else "ies")
        for key, (count, first) in self.not_numbers.items():
            ours = self.mapping[key]
            shown = f"{first!r}"[:40]
            if not any(ours in r for r in records) and ours in ("train_loss", "val_loss"):
                raise ProbeInputError(f"{path}: its {key!r} values are not numbers ({shown}, a "
                                      f"{type(first).__name__}): nothing to diagnose")
            log.warning("%s: %d %r value%s not a number (%s, a %s), left out", path, count, key,
                        "s" if count > 1 else "", shown, type(first).__name__)


def read_json(path: Path, each_entry: Callable[[Any], None] | None = None,
              many: Callable[[list[Any]], None] | None = None) -> dict[str, Any]:
    """A JSON object from `path`, its log_history given to `each_entry` entry by entry when set
    (and to `many` in bulk, when given)."""
    encoding = text_encoding(path, "JSON") if each_entry is not None else "utf-8"
    try:
        if each_entry is None:
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            data = read_object_streaming(path, "log_history", each_entry, encoding, many)
    except json.JSONDecodeError as err:
        raise ProbeInputError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    except JsonStreamError as err:
        raise ProbeInputError(f"{path}: not valid JSON ({err})") from None
    except UnicodeDecodeError:
        raise ProbeInputError(f"{path}: not a text file") from None
    except RecursionError:  # json's decoder recurses once per level
        raise ProbeInputError(f"{path}: not valid JSON (nested too deep)") from None
    except ValueError as err:  # an integer over Python's 4300 digits
        raise ProbeInputError(f"{path}: not readable JSON ({str(err).splitlines()[0][:80]})") from None
    except OSError as err:
        raise ProbeInputError(f"{path}: cannot read ({err.strerror or err})") from None
    if not isinstance(data, dict):
        raise ProbeInputError(f"{path}: not a JSON object (a {type(data).__name__})")
    return data


def as_streamed(value: Any) -> Any:
    """A value json_stream.bulk_elements decoded (or an entry of them, its own values) as
    read_object_streaming reads it one by one: an int over MAX_INT_DIGITS digits is a float."""
    if type(value) is dict:
        return {k: as_streamed(v) if type(v) is int else v for k, v in value.items()}
    if type(value) is int and not -LONGEST < value < LONGEST:
        return float(str(value))
    return value


def number(value: Any) -> float | None:
    """A logged value as a float (JSON's NaN and Infinity included); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def model_config(folder: Path) -> dict[str, Any]:
    """What config.json (in the checkpoint's folder, else its output directory) says of the model,
    in our config's names; {} when there is none or it is unreadable (the rules then say so)."""
    candidates = [folder / "config.json"]
    if CHECKPOINT_DIR.match(folder.name):
        candidates.append(folder.parent / "config.json")
    for candidate in candidates:
        if not candidate.is_file():
            continue
        try:
            config = read_json(candidate)
        except ProbeInputError as err:
            log.warning("%s: ignored (%s)", candidate, err)
            continue
        return {ours: value for ours, names in HF_MODEL_KEYS.items()
                if isinstance(value := next((config[n] for n in names if n in config), None), int)}
    return {}
