"""nanochat's checkpoints (karpathy/nanochat): ``<base>/base_checkpoints/dN/model_NNNNNN.pt`` with
``meta_NNNNNN.json`` beside it (its ``chatsft_checkpoints`` and ``chatrl_checkpoints`` alike).
Built with nanochat's own ``GPT`` and ``GPTConfig`` where the ``nanochat`` package is importable
(its users have it), never rebuilt as ours: the probes read its attention calls through the tap.

A folder ``dN`` reads as a run whose snapshots are its model files (:mod:`.run` numbers them),
so ``--ckpt dN`` means its latest step. A load reads top to bottom: the meta file's
``model_config`` and ``step``, the weights with ``torch.load(weights_only=True)`` (bfloat16 made
float32 on the CPU, ``torch.compile``'s ``_orig_mod.`` prefix dropped, as nanochat's own loader
does), the model built as nanochat builds it, then its tokenizer read from the plain data of its
``tokenizer.pkl`` (:mod:`.nanochat_tokenizer`: never unpickled), else token ids only, said once.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

import torch

from models.store.files import CheckpointError, read_json_object
from models.store.foreign import ForeignConfig
from models.store.nanochat_files import meta_file, nanochat_shape
from models.store.nanochat_tokenizer import NanochatTokenizer, TokenizerFileError, load_encoding
from models.store.result import Snapshot
from models.store.weights import torch_load
from models.tokenizer_base import Tokenizer

__all__ = ["INSTALL", "load_nanochat"]

logger = logging.getLogger(__name__)

INSTALL = ("pip install -e PATH/TO/nanochat (its clone: the pyproject installs the nanochat "
           "package), or run from the clone's folder")
_SAID: set[str] = set()  # the token-ids-only line, once per tokenizer folder


def load_nanochat(path: Path, device: str | torch.device = "cpu") -> Snapshot:
    """nanochat's model file `path` (with its meta file) as nanochat's own GPT, in eval mode."""
    shape, step = nanochat_shape(path)
    meta = read_json_object(meta_file(path))
    device = torch.device(device)
    state = _weights(path, device)
    check_declared(shape, state, path)  # before anything is built: a meta file may declare any size
    gpt = _nanochat_gpt(path)
    model = _build(gpt, dict(meta["model_config"]), state, device, path)
    config = ForeignConfig(**{**shape.to_dict(), "n_params": sum(p.numel() for p in model.parameters())})
    tokenizer, hint = _tokenizer(path, shape.d_vocab)
    info = {"format_version": None, "source": "nanochat", "model": config.to_dict(),
            "tokenizer": None if tokenizer is None else {"kind": tokenizer.kind, "files": list(tokenizer.files)},
            "step": step, "tokens_seen": None, "train_config": meta.get("user_config"), "tokenizer_hint": hint}
    return Snapshot(model, tokenizer, config, info, path)


def _nanochat_gpt(path: Path) -> Any:
    try:
        from nanochat import gpt
    except ImportError as exc:
        raise CheckpointError(f"{path}: a nanochat checkpoint is built with nanochat's own GPT, and the "
                              f"nanochat package does not import here ({exc}): {INSTALL}") from None
    return gpt


def _weights(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    state = torch_load(path)  # weights_only=True: a file that needs more is refused in one line
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected nanochat's state dict of tensors, got {type(state).__name__}")
    cast = device.type in ("cpu", "mps")  # bfloat16 matmuls there are slow or missing
    return {k.removeprefix("_orig_mod."): v.float() if cast and v.dtype == torch.bfloat16 else v
            for k, v in state.items()}


def _build(gpt: Any, kwargs: dict[str, Any], state: dict[str, torch.Tensor], device: torch.device,
           path: Path) -> torch.nn.Module:
    """GPT(GPTConfig(**kwargs)) made on the meta device, then its buffers (rotary tables) made by
    its own init_weights and every weight assigned from `state`, as nanochat's build_model does."""
    kwargs.setdefault("window_pattern", "L")  # checkpoints older than sliding windows: full context
    try:
        config = gpt.GPTConfig(**kwargs)
    except TypeError as exc:
        raise CheckpointError(f"{meta_file(path)}: model_config does not fit this nanochat's GPTConfig "
                              f"({exc}): use the nanochat version that trained it") from None
    # older checkpoints lack the per-layer residual scalars: nanochat's own defaults (1 and 0)
    state.setdefault("resid_lambdas", torch.ones(config.n_layer))
    state.setdefault("x0_lambdas", torch.zeros(config.n_layer))
    said = io.StringIO()
    with contextlib.redirect_stdout(said):  # nanochat prints "Padding vocab_size ..." on stdout
        try:
            with torch.device("meta"):
                model = gpt.GPT(config)
        except (AssertionError, ValueError, RuntimeError) as exc:  # nanochat's own checks of its config
            raise CheckpointError(f"{meta_file(path)}: nanochat's GPT refuses its model_config "
                                  f"({type(exc).__name__}: {str(exc).strip()[:200]})") from None
        check_names(model.state_dict(), state, path)  # on the meta device: nothing allocated yet
        model.to_empty(device=device)
        model.init_weights()
    if said.getvalue().strip():
        logger.debug("nanochat: %s", said.getvalue().strip())
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:  # names and shapes fit: a dtype, say
        raise CheckpointError(f"{path}: its weights do not load into nanochat's GPT: "
                              f"{' '.join(str(exc).split())[:300]}") from None
    return model.eval()


def check_declared(shape: ForeignConfig, state: dict[str, torch.Tensor], path: Path) -> None:
    """The meta file declares no more than the weights hold (blocks, width, vocabulary): a meta file
    saying 10,000 layers would otherwise be built before any weight is compared."""
    blocks = [int(k.split(".")[2]) for k in state if k.startswith("transformer.h.") and k.split(".")[2].isdigit()]
    held = max(blocks, default=-1) + 1
    table = state.get("transformer.wte.weight")
    rows, width = tuple(table.shape) if table is not None and table.dim() == 2 else (None, None)
    said = [f"{what} {declared} where the weights hold {found}" for what, declared, found in (
        ("n_layer", shape.n_layers, held), ("n_embd", shape.d_model, width), ("vocab_size", shape.d_vocab, rows))
        if found is not None and (declared > found if what != "n_embd" else declared != found)]
    if said:
        raise CheckpointError(f"{meta_file(path)}: its model_config declares {'; '.join(said)} "
                              f"({path.name}): not built")


def check_names(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor], path: Path) -> None:
    """The file's tensors are the GPT's, by name and shape: else one line naming the difference."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k} {list(state[k].shape)} (the GPT's: {list(v.shape)})" for k, v in expected.items()
              if k in state and state[k].shape != v.shape]
    said = [f"{what} {', '.join(names[:4])}{', ...' if len(names) > 4 else ''} ({len(names)})"
            for what, names in (("missing", missing), ("unexpected", unexpected), ("shape of", shapes)) if names]
    if said:
        raise CheckpointError(f"{path}: its weights do not fit the GPT its meta file describes: {'; '.join(said)}")


def _tokenizer(path: Path, d_vocab: int) -> tuple[Tokenizer | None, str | None]:
    """nanochat's tokenizer from ``<base>/tokenizer`` (base = the folder holding base_checkpoints/),
    read by :mod:`.nanochat_tokenizer` (never unpickled), or None and one line (said once)."""
    folder = path.resolve().parent.parent.parent / "tokenizer"
    file = folder / "tokenizer.pkl"
    hint = None
    if not file.is_file():
        hint = f"no nanochat tokenizer at {folder} (nanochat's tok_train writes it there)"
    else:
        try:
            tokenizer = NanochatTokenizer(load_encoding(file), folder)
        except ImportError:
            hint = f"{file} needs the tiktoken package to encode text (pip install tiktoken)"
        except TokenizerFileError as exc:
            hint = str(exc)
        else:
            if tokenizer.vocab_size != d_vocab:
                raise CheckpointError(f"{folder}: nanochat's tokenizer has {tokenizer.vocab_size} tokens but "
                                      f"the model's vocabulary is {d_vocab}: they do not belong together")
            return tokenizer, None
    if str(folder) not in _SAID:
        _SAID.add(str(folder))
        logger.warning("%s: loaded with token ids only; %s", path, hint)
    return None, hint
