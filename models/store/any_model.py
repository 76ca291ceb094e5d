"""A snapshot of any model (`models.store.any_files` says what its files hold): written by the
Monitor's `save_every`, loaded by `load_checkpoint`.

Loaded without the user's code (the default: it is never imported unless asked), the model is a
`SavedModel`: the weights under the module's own names and its layout, and no forward; the probes
read the readings saved with it (`probes.sources.saved`), the neighbour tables its `W_E` / `W_U`.
With `model_code` ("path/to/mygpt.py:GPT", the user's explicit word), the model is rebuilt from
their code (`models.store.model_code`) and loads the weights strictly: then it runs on any text.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from models.layout import Layout
from models.store.any_checks import check_weights
from models.store.any_files import (ANY_FORMAT, ANY_VERSION, CONFIG_FILE, READINGS_FILE, any_shape, read_any_meta,
                                    read_readings)
from models.store.files import CheckpointError, dumps_json, write_bytes_atomic
from models.store.foreign import ForeignConfig
from models.store.front import MODEL_FILE, load_snapshot_tokenizer
from models.store.result import Snapshot
from models.store.snapshot import read_checked, state_dict_for_saving, write_directory, write_tensors
from models.tokenizers import Tokenizer

__all__ = ["ANY_SOURCE", "SavedModel", "code_hint", "load_any_snapshot", "save_any_snapshot"]

ANY_SOURCE = "any-model"  # meta["source"] of a loaded snapshot of any model


def code_hint(meta: dict[str, Any]) -> str:
    """How to give the model's code, in one line."""
    name = str(meta.get("class") or "").rsplit(".", 1)[-1] or "Model"
    return f"give --model-code path/to/your_file.py:{name} (your code, run only on that word) to run it"


class SavedModel(nn.Module):
    """The weights of a model whose code is not at hand, under its own names, with its layout: no
    forward. `W_E` [vocab d_model] and `W_U` [d_model vocab] are its token embedding and its
    unembedding as the layout names them, cut to the logits' vocabulary (the neighbour tables)."""

    def __init__(self, state: dict[str, torch.Tensor], buffers: list[str], layout: Layout,
                 meta: dict[str, Any], path: Path):
        super().__init__()
        self.layout, self.meta, self.path = layout, meta, path
        self.architecture = str(meta.get("class") or "model").rsplit(".", 1)[-1]
        self._readings: dict[str, torch.Tensor] | None = None
        kept = set(buffers)
        for name, tensor in state.items():
            where, _, leaf = name.rpartition(".")
            holder = self._holder(where)
            if name in kept:
                holder.register_buffer(leaf, tensor)
            else:
                holder.register_parameter(leaf, nn.Parameter(tensor, requires_grad=False))

    def _holder(self, where: str) -> nn.Module:
        module: nn.Module = self
        for part in where.split(".") if where else []:
            if part not in module._modules:
                module.add_module(part, nn.Module())
            module = module._modules[part]
        return module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"{self.path.parent.name}/{self.path.name} holds a {self.architecture}'s weights and what "
                         f"the probes read at step {self.meta.get('step')}, not its code: it reads its saved sample "
                         f"only; {code_hint(self.meta)} on other text")

    def readings(self) -> dict[str, torch.Tensor]:
        """The saved readings as tensors (read once)."""
        if self._readings is None:
            self._readings = {k: torch.from_numpy(v.copy()) for k, v in read_readings(self.path, self.meta).items()}
        return self._readings

    def _named(self, part: str) -> str:
        name = getattr(self.layout, part)
        if not name:
            raise ValueError(f"{self.architecture}'s layout has no {part.replace('_', ' ')}: "
                             f"{self.layout.why_missing(part)}")
        return name

    @property
    def d_vocab(self) -> int:
        """Columns of the logits (a table padded past the vocabulary, as nanochat's, has more rows)."""
        return int(self.meta["model"]["d_vocab"])

    @property
    def W_E(self) -> torch.Tensor:  # [vocab d_model]
        return self.get_parameter(self._named("token_embedding"))[: self.d_vocab]

    @property
    def W_U(self) -> torch.Tensor:  # [d_model vocab]
        return self.get_submodule(self._named("unembedding")).weight[: self.d_vocab].T


# --------------------------------------------------------------------------- save


def save_any_snapshot(directory: str | Path, model: nn.Module, tokenizer: Tokenizer | None, *, layout: Layout,
                      shape: ForeignConfig, readings: dict[str, torch.Tensor], readings_info: dict[str, Any],
                      step: int, tokens_seen: int = 0, model_args: dict[str, Any] | None = None) -> Path:
    """Write a snapshot of any model atomically (as `save_snapshot`): its state dict, the readings
    (`models.store.any_files`), the tokenizer and config.json."""
    if tokenizer is not None and tokenizer.vocab_size > shape.d_vocab:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary is {shape.d_vocab}")
    state = state_dict_for_saving(model)
    buffers = sorted(set(state) & {name for name, _ in model.named_buffers()})
    meta = {"format": ANY_FORMAT, "format_version": ANY_VERSION, "model": shape.to_dict(),
            "class": f"{type(model).__module__}.{type(model).__qualname__}", "layout": layout.to_dict(),
            "buffers": buffers, "model_args": model_args,
            "tokenizer": None if tokenizer is None else {"kind": tokenizer.kind, "files": list(tokenizer.files)},
            "step": step, "tokens_seen": tokens_seen, "tensors_sha256": None, "readings": dict(readings_info),
            "train_config": None, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    plain = {name: t.detach().to("cpu").contiguous() for name, t in readings.items()}

    def fill(tmp: Path) -> None:
        meta["tensors_sha256"] = write_tensors(tmp / MODEL_FILE, state)
        meta["readings"]["sha256"] = write_tensors(tmp / READINGS_FILE, plain)
        if tokenizer is not None:
            tokenizer.save(tmp)
        write_bytes_atomic(tmp / CONFIG_FILE, (dumps_json(meta, indent=2) + "\n").encode("utf-8"))

    needed = sum(t.numel() * t.element_size() for t in [*state.values(), *plain.values()])
    return write_directory(Path(directory), fill, needed)


# --------------------------------------------------------------------------- load


def load_any_snapshot(directory: Path, meta: dict[str, Any], device: str | torch.device = "cpu",
                      model_code: str | None = None) -> Snapshot:
    """The snapshot at `directory`: a SavedModel, or with `model_code` the user's module rebuilt
    from their code with the saved weights (strictly), on `device`, in eval mode."""
    meta = read_any_meta(directory, meta)
    shape = any_shape(meta, directory / CONFIG_FILE)
    state = read_checked(directory / MODEL_FILE, meta["tensors_sha256"], "the snapshot has no weights")
    check_weights(state, meta["layout"], shape.d_vocab, directory / MODEL_FILE)
    tokenizer = load_snapshot_tokenizer(directory, meta["tokenizer"], shape)
    layout = Layout.from_dict(meta["layout"])
    if model_code:
        from models.store.model_code import rebuild

        model = rebuild(model_code, meta.get("model_args"), state, directory, meta.get("class"))
    else:
        model = SavedModel(state, meta["buffers"], layout, meta, directory)
    info = {**meta, "source": ANY_SOURCE, "model_code": model_code,
            "tokenizer_hint": "the Monitor saves the tokenizer it was given (tokenizer=)"}
    return Snapshot(model.to(device).eval(), tokenizer, shape, info, directory)
