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

import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable

from probes.doctor.log_file import (Log, check_not_lfs_pointer, check_user_tags, kind_of_losses, merge_steps,
                                    require_loss, user_tags)
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
    """trainer_state.json as a Log; ProbeInputError (one line naming the file) if unreadable."""
    check_not_lfs_pointer(path)
    state = read_json(path)
    history = state.get("log_history")
    if not isinstance(history, list):
        raise ProbeInputError(f"{path}: no log_history list (not a Trainer's {STATE_FILE}?)")
    if not history:
        raise ProbeInputError(f"{path}: log_history is empty: nothing logged yet "
                              f"(the Trainer logs every logging_steps={state.get('logging_steps')} steps)")
    given = user_tags(tags)
    mapping = {**TRAINER_KEYS, **given}
    entries = [e for e in history if isinstance(e, dict) and isinstance(e.get("step"), int)]
    present = {k for e in entries for k in e if k != "step"}
    check_user_tags(path, given, present, "log_history key")
    records = merge_steps((e["step"], {ours: value for key, ours in mapping.items()
                                       if (value := number(e.get(key))) is not None}) for e in entries)
    require_loss(path, records, present, "log_history keys")
    train = {key: state[name] for key, name in (("steps", "max_steps"), ("log_every", "logging_steps"))
             if isinstance(state.get(name), int) and state[name] > 0}
    kind, why = kind_of_losses(records, present)
    return Log(path, STATE_FILE, records, model_config(path.parent), train, "hf", kind, why)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ProbeInputError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    except UnicodeDecodeError:
        raise ProbeInputError(f"{path}: not a text file") from None
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
