"""A snapshot directory read without its weights and without torch: its config.json (checked as
loading checks it), its model config and its tokenizer. The app's pages draw their first chart
from this and the view saved beside the snapshot (`models.store.view_file`) before any model
loads (`models.store.load` builds the model behind them).

    front = read_front(Path("checkpoints/shakespeare_gpt/step_001500"))
    front.config.n_layers, front.tokenizer.encode("ROMEO"), front.step, front.kind   # "snapshot"

Our snapshot and a snapshot of any model (`models.store.any_files`) have a front; any other
format (a Hugging Face directory, a nanoGPT ckpt.pt, a series .pt) has none: `read_front` gives None.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.config import ModelConfig, config_from_dict
from models.store.files import CheckpointError, check_snapshot_meta, read_json_object
from models.tokenizers import Tokenizer, TokenizerError, load_tokenizer

__all__ = ["CONFIG_FILE", "FORMAT_VERSION", "Front", "MODEL_FILE", "REQUIRED_KEYS", "SNAPSHOT_KEYS", "load_snapshot_tokenizer",
           "parse_config", "read_front", "read_snapshot_meta"]

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
MODEL_FILE = "model.safetensors"  # the weights, of our snapshot and of a snapshot of any model
REQUIRED_KEYS = ("format_version", "model", "tokenizer", "step", "tokens_seen", "tensors_sha256")
SNAPSHOT_KEYS = REQUIRED_KEYS + ("train_config", "created")  # everything save_snapshot writes


@dataclass(frozen=True)
class Front:
    """What a snapshot directory says of its model, read without its weights."""

    path: Path
    kind: str  # "snapshot" (ours) | "any-model" (a snapshot of any model)
    config: Any  # a ModelConfig, or a ForeignConfig for a snapshot of any model
    tokenizer: Tokenizer | None
    meta: dict[str, Any]  # config.json, checked

    @property
    def step(self) -> int | None:
        return self.meta.get("step")


def read_snapshot_meta(directory: Path) -> dict[str, Any]:
    """Our snapshot's config.json, checked: its keys, version, step and tokens seen."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; a snapshot directory needs {CONFIG_FILE}")
    meta = read_json_object(path)
    check_snapshot_meta(meta, path, REQUIRED_KEYS, SNAPSHOT_KEYS, FORMAT_VERSION)
    return meta


def load_snapshot_tokenizer(directory: Path, info: Any, config: Any) -> Tokenizer | None:
    """The tokenizer config.json's `tokenizer` entry names (None for none), its files inside `directory`."""
    if info is None:
        return None
    source = directory / CONFIG_FILE
    if not isinstance(info, dict) or "kind" not in info:
        raise CheckpointError(f"{source}: 'tokenizer' must be an object with a 'kind', got {info!r}")
    files = info.get("files") or []
    if not isinstance(files, list) or not all(isinstance(n, str) for n in files):
        raise CheckpointError(f"{source}: 'tokenizer.files' must be a list of file names, got {files!r}")
    for name in files:
        if Path(name).name != name or name in (".", ".."):  # no paths: nothing outside the snapshot
            raise CheckpointError(f"{source}: tokenizer file {name!r} must be a plain file name "
                                  "inside the snapshot directory")
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory / name}: missing {info['kind']} tokenizer file")
    try:
        tokenizer = load_tokenizer(directory, info["kind"])
    except TokenizerError as exc:
        raise CheckpointError(f"{directory}: cannot load tokenizer: {exc}") from None
    if tokenizer.vocab_size > config.d_vocab:
        raise CheckpointError(f"{directory}: tokenizer has {tokenizer.vocab_size} tokens but the "
                              f"model's d_vocab is {config.d_vocab}")
    return tokenizer


def read_front(directory: str | Path) -> Front | None:
    """The front of our snapshot or of a snapshot of any model; None for any other checkpoint. A
    damaged config.json or tokenizer is a CheckpointError, as loading says it."""
    from models.store.any_files import any_shape, is_any_snapshot, read_any_meta

    directory = Path(directory)
    if not (directory / CONFIG_FILE).is_file():
        return None
    meta = read_json_object(directory / CONFIG_FILE)
    if is_any_snapshot(meta):
        meta = read_any_meta(directory, meta)
        config, kind = any_shape(meta, directory / CONFIG_FILE), "any-model"
    elif "format_version" in meta and "tensors_sha256" in meta:  # ours (a Hugging Face config.json has neither)
        meta = read_snapshot_meta(directory)
        config, kind = parse_config(meta["model"], directory / CONFIG_FILE), "snapshot"
    else:
        return None
    return Front(directory, kind, config, load_snapshot_tokenizer(directory, meta["tokenizer"], config), meta)


def parse_config(data: Any, source: Path) -> ModelConfig:
    """``config_from_dict``; an invalid config becomes a CheckpointError naming ``source``."""
    try:
        return config_from_dict(data)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{source}: invalid model config: {exc}") from None
