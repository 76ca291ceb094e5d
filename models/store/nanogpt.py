"""nanoGPT checkpoints: the ``ckpt.pt`` its train.py saves, becoming our Transformer.

The file is a dict ``{"model": state_dict, "optimizer": ..., "model_args": {n_layer, n_head,
n_embd, block_size, bias, vocab_size, dropout}, "iter_num": N, "best_val_loss": ..., "config":
{...}}`` read with ``torch.load(weights_only=True)``: a file that needs more is refused by
:func:`~models.store.weights.torch_load` in one line, never unpickled. A load reads top to
bottom: config from ``model_args``, weights checked against it in nanoGPT's names, our model
built and loaded, then the tokenizer: the ``meta.pkl`` character vocabulary nanoGPT writes
beside its data (given, beside the file, or at ``data/<dataset>/meta.pkl`` of the nanoGPT
checkout above it), or GPT-2's BPE files when the vocabulary is GPT-2's; else token ids only.
"""

from __future__ import annotations

import builtins
import logging
import pickle
from pathlib import Path
from typing import Any

import torch

from models.store.files import CheckpointError
from models.store.gpt2_layout import (GPT2Dims, check_layout, check_vocab_fits, gpt2_config, is_tied,
                                      our_state, without_buffers)
from models.store.result import Snapshot
from models.store.weights import build_and_load, strip_prefixes
from models.gpt2_bpe import GPT2BPETokenizer, find_gpt2_files
from models.config import TransformerConfig
from models.tokenizers import CharTokenizer, Tokenizer, TokenizerError

__all__ = ["int_or_none", "is_nanogpt", "load_nanogpt", "nanogpt_config", "read_meta_pkl", "why_not_nanogpt"]

logger = logging.getLogger(__name__)

META_PKL = "meta.pkl"
GPT2_VOCABS = (50257, 50304)  # GPT-2's BPE, and nanoGPT's padding of it to a multiple of 64
INT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def is_nanogpt(obj: Any) -> bool:
    """A nanoGPT checkpoint dict: weights under "model", the architecture under "model_args"."""
    return isinstance(obj, dict) and isinstance(obj.get("model_args"), dict) and "model" in obj


def why_not_nanogpt(obj: Any) -> str:
    """What keeps `obj` from being a nanoGPT checkpoint, naming the key that is missing."""
    keys = set(obj) if isinstance(obj, dict) else set()
    if "model_args" not in keys:
        return "no 'model_args'" + (" beside its 'model'" if "model" in keys else "")
    if not isinstance(obj["model_args"], dict):
        return f"its 'model_args' is a {type(obj['model_args']).__name__}, not a dict"
    return "it has 'model_args' but no 'model', the weights nanoGPT saves beside them"


def load_nanogpt(path: Path, obj: dict[str, Any], device: str | torch.device = "cpu",
                 tokenizer_path: str | Path | None = None) -> Snapshot:
    """The nanoGPT checkpoint `obj` (read from `path`) as our model with its tokenizer."""
    dims, dropout = _dims(obj["model_args"], path)
    if not isinstance(obj["model"], dict):
        raise CheckpointError(f"{path}: nanoGPT 'model' entry is a {type(obj['model']).__name__}, "
                              "not a state dict")
    source = without_buffers(strip_prefixes(obj["model"]))  # torch.compile's _orig_mod. removed
    check_layout(source, dims, conv1d=False, lm_head=True, source=path, said_by="model_args")
    config = _config(dims, dropout, source)
    model = build_and_load(config, our_state(source, config, conv1d=False), path, exact_names=True)
    tokenizer, hint = _tokenizer(path, obj, config.d_vocab, tokenizer_path)
    meta = {"format_version": None, "source": "nanogpt", "model": config.to_dict(),
            "tokenizer": None if tokenizer is None else {"kind": tokenizer.kind, "files": list(tokenizer.files)},
            "step": int_or_none(obj.get("iter_num")), "tokens_seen": None,
            "best_val_loss": _float_or_none(obj.get("best_val_loss")),
            "train_config": obj.get("config") if isinstance(obj.get("config"), dict) else None,
            "tokenizer_hint": hint}
    return Snapshot(model.to(device).eval(), tokenizer, config, meta, path)


def nanogpt_config(path: Path, obj: dict[str, Any]) -> TransformerConfig:
    """The config `load_nanogpt` builds from `obj`'s model_args (weights unread but for the tying test)."""
    dims, dropout = _dims(obj["model_args"], path)
    return _config(dims, dropout, strip_prefixes(obj["model"]) if isinstance(obj.get("model"), dict) else {})


def _config(dims: GPT2Dims, dropout: float, state: dict[str, Any]) -> TransformerConfig:
    return gpt2_config(dims, act_fn="gelu", tied=is_tied(state), dropout=dropout)  # nn.GELU(): exact


def _dims(args: dict[str, Any], path: Path) -> tuple[GPT2Dims, float]:
    """model_args checked one by one: what each must be, named."""
    for name in INT_ARGS:
        value = args.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{path}: model_args[{name!r}] must be a positive integer, got {value!r}")
    bias = args.get("bias", True)
    if not isinstance(bias, bool):
        raise CheckpointError(f"{path}: model_args['bias'] must be true or false, got {bias!r}")
    if args["n_embd"] % args["n_head"]:
        raise CheckpointError(f"{path}: model_args n_embd={args['n_embd']} is not divisible by "
                              f"n_head={args['n_head']}")
    dropout = args.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise CheckpointError(f"{path}: model_args['dropout'] must be in [0, 1), got {dropout!r}")
    dims = GPT2Dims(n_layer=args["n_layer"], n_head=args["n_head"], n_embd=args["n_embd"],
                    n_ctx=args["block_size"], vocab_size=args["vocab_size"], d_mlp=4 * args["n_embd"],
                    bias=bias)
    return dims, float(dropout)


def int_or_none(value: Any) -> int | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:  # nanoGPT saves a 0-d tensor
        value = value.item()
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------- tokenizer


def _tokenizer(path: Path, obj: dict[str, Any], d_vocab: int,
               given: str | Path | None) -> tuple[Tokenizer | None, str | None]:
    """(tokenizer, None), or (None, the one line saying how to give it one), warned once."""
    for candidate in _candidates(path, obj, given):
        tokenizer = _read_tokenizer(candidate)
        if tokenizer is not None:
            check_vocab_fits(tokenizer, d_vocab, candidate)
            return tokenizer, None
    if given is not None:
        raise CheckpointError(f"{given}: no tokenizer there (expected nanoGPT's {META_PKL}, or GPT-2's "
                              "tokenizer.json or vocab.json + merges.txt)")
    if d_vocab in GPT2_VOCABS:
        hint = ("its vocabulary is GPT-2's BPE, whose files are not here: put GPT-2's tokenizer.json "
                "(or vocab.json and merges.txt) beside it or pass --tokenizer DIR")
    else:
        hint = f"no {META_PKL} beside it: pass --tokenizer PATH/{META_PKL} (nanoGPT writes it in data/<dataset>/)"
    logger.warning("%s: loaded with token ids only; %s", path, hint)
    return None, hint


def _candidates(path: Path, obj: dict[str, Any], given: str | Path | None) -> list[Path]:
    """Where a tokenizer may be: the given path alone, else beside the file, else nanoGPT's
    ``data/<dataset>/meta.pkl`` in the checkout above the file's out_dir."""
    if given is not None:
        return [Path(given)]
    found = [path.parent]
    dataset = (obj.get("config") or {}).get("dataset") if isinstance(obj.get("config"), dict) else None
    if isinstance(dataset, str) and dataset and Path(dataset).name == dataset:
        found += [root / "data" / dataset / META_PKL for root in (path.parent.parent, path.parent.parent.parent)]
    return found


def _read_tokenizer(candidate: Path) -> Tokenizer | None:
    """The tokenizer at `candidate` (a meta.pkl, or a directory holding one or GPT-2's files)."""
    if candidate.is_file():
        return read_meta_pkl(candidate) if candidate.name.endswith(".pkl") else None
    if not candidate.is_dir():
        return None
    if (candidate / META_PKL).is_file():
        return read_meta_pkl(candidate / META_PKL)
    files = find_gpt2_files(candidate)
    if files is None:
        return None
    try:
        return GPT2BPETokenizer.from_files(files)
    except TokenizerError as exc:
        raise CheckpointError(str(exc)) from None


class _PlainUnpickler(pickle.Unpickler):
    """meta.pkl is a pickled dict of str and int, which pickle builds from opcodes alone. A general
    ``pickle.load`` would call whatever the file names; this one finds builtins dict/str/int only
    and refuses anything else."""

    ALLOWED = {("builtins", "dict"), ("builtins", "str"), ("builtins", "int")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.ALLOWED:
            return getattr(builtins, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name}: meta.pkl should hold only a dict of "
                                     "strings and integers")


def read_meta_pkl(path: Path) -> CharTokenizer:
    """nanoGPT's character vocabulary ``{"vocab_size", "itos", "stoi"}`` as a CharTokenizer."""
    try:
        with open(path, "rb") as f:
            meta = _PlainUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: cannot read nanoGPT's vocabulary: {exc}") from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if not isinstance(itos, dict) or not all(isinstance(i, int) for i in itos):
        raise CheckpointError(f"{path}: expected a dict with 'itos' mapping ids to characters")
    try:
        return CharTokenizer([itos.get(i) for i in range(len(itos))])
    except TokenizerError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
