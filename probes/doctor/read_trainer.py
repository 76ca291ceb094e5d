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
from pathlib import Path
from typing import Any, Callable, Iterable

from probes.doctor.json_stream import JsonStreamError, read_object_streaming
from probes.doctor.log_file import (Log, check_not_lfs_pointer, check_user_tags, kind_of_losses, require_loss,
                                    user_tags)
from probes.doctor.text_log import check_regular_file, text_encoding
from probes.doctor.thinning import Thinned
from probes.errors import ProbeInputError

__all__ = ["STATE_FILE", "TRAINER_KEYS", "find_trainer_state", "read_trainer_state"]

log = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
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
    state = read_json(path, history.add)
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

    def put(self, step: int, values: dict[str, float]) -> None:
        """Into the step-ordered records: appended, or merged into its step's record."""
        records = self.records
        if records and records[-1]["step"] == step:
            records[-1].update(values)
        elif not records or records[-1]["step"] < step:
            records.append({"step": step, **values})
        else:  # a step logged out of order (rare): found by bisection
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


def read_json(path: Path, each_entry: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """A JSON object from `path`, its log_history given to `each_entry` entry by entry when set."""
    encoding = text_encoding(path, "JSON") if each_entry is not None else "utf-8"
    try:
        if each_entry is None:
            data = json.loads(path.read_text(encoding="utf-8"))
        else:
            data = read_object_streaming(path, "log_history", each_entry, encoding)
    except json.JSONDecodeError as err:
        raise ProbeInputError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    except JsonStreamError as err:
        raise ProbeInputError(f"{path}: not valid JSON ({err})") from None
    except UnicodeDecodeError:
        raise ProbeInputError(f"{path}: not a text file") from None
    except ValueError as err:  # an integer over Python's 4300 digits
        raise ProbeInputError(f"{path}: not readable JSON ({str(err).splitlines()[0][:80]})") from None
    except OSError as err:
        raise ProbeInputError(f"{path}: cannot read ({err.strerror or err})") from None
    if not isinstance(data, dict):
        raise ProbeInputError(f"{path}: not a JSON object (a {type(data).__name__})")
    return data


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
