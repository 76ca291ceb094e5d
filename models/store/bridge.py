"""Hugging Face causal-LM directories of any architecture TransformerLens' ``TransformerBridge``
adapts (Llama, Qwen2, Mistral, Gemma, GPT-NeoX, Phi, ...): read through the bridge, never rebuilt.
GPT-2 directories stay with :mod:`.hf` (rebuilt as ours).

A load reads top to bottom: the config's shape (:func:`models.store.foreign.hf_shape`, torch-free, also what
``peek`` and the app show), the model with ``transformers`` from the local files only (nothing is
downloaded; the ``.bin`` format goes through ``torch.load(weights_only=True)`` inside
``transformers``), the tokenizer from the directory when it has one, then the bridge. The bridge
switches the model it wraps to eager attention in place: harmless here, the model is our own copy.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch

from models.store.files import CheckpointError
from models.store.foreign import BRIDGE_SOURCE, ForeignConfig, hf_shape, refuse_custom_code
from models.store.hf_weights import check_declared_sizes, check_float_weights
from models.store.result import Snapshot
from models.tokenizer_base import Tokenizer, TokenizerError, UnknownTokenError, as_id_list

__all__ = ["HFTokenizer", "load_hf_bridge"]

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
INSTALL = "pip install transformers (or scratchscope[hf])"
def load_hf_bridge(directory: Path, data: dict[str, Any], device: str | torch.device = "cpu") -> Snapshot:
    """The Hugging Face directory whose config.json is `data`, as a TransformerBridge (eval mode)."""
    refuse_custom_code(data, directory)  # before transformers, which would prompt and run it
    shape = hf_shape(data, directory)
    check_declared_sizes(directory, data["text_config"] if isinstance(data.get("text_config"), dict) else data)
    transformers = _transformers(directory)
    hf_model = _hf_model(transformers, directory).to(device)  # the bridge boots on the model's device
    tokenizer, hint = _tokenizer(transformers, directory, shape.d_vocab)
    from transformer_lens import TransformerBridge

    try:
        bridge = TransformerBridge.boot_transformers(
            str(directory), hf_model=hf_model, trust_remote_code=False,
            tokenizer=tokenizer.backend if tokenizer else _ids_tokenizer(transformers, shape.d_vocab))
    except Exception as exc:  # noqa: BLE001 - an architecture TransformerLens has no adapter for
        raise CheckpointError(f"{directory}: TransformerLens cannot read model_type "
                              f"{data.get('model_type')!r}: {_first_line(exc)}") from None
    if tokenizer is None:  # the ids-only tokenizer only got the bridge booted
        bridge.tokenizer = None
    bridge.eval()
    n_params = sum(p.numel() for p in hf_model.parameters())
    config = ForeignConfig(**{**shape.to_dict(), "n_params": n_params,
                              "n_ctx": int(bridge.cfg.n_ctx), "d_vocab": int(bridge.cfg.d_vocab)})
    meta = {"format_version": None, "source": BRIDGE_SOURCE, "model": config.to_dict(),
            "tokenizer": None if tokenizer is None else {"kind": tokenizer.kind, "files": list(tokenizer.files)},
            "step": None, "tokens_seen": None, "train_config": None, "tokenizer_hint": hint}
    return Snapshot(bridge, tokenizer, config, meta, directory)


def _transformers(directory: Path) -> Any:
    try:
        import transformers
    except ImportError:
        raise CheckpointError(f"{directory}: a Hugging Face directory needs the transformers package: "
                              f"{INSTALL}") from None
    return transformers


def _hf_model(transformers: Any, directory: Path) -> Any:
    """The model in float32 from the directory's own files (a missing file is an error, never a
    download). transformers' own report (its LOAD REPORT table, its progress bar) is silenced: its
    loading info is read here, and a weight the config has no place for, or a place the weights do
    not fill (left randomly initialised by transformers), is refused in one line naming them."""
    check_float_weights(directory)  # transformers would cast int32 weights without a word
    bars, level = transformers.utils.logging.is_progress_bar_enabled(), transformers.utils.logging.get_verbosity()
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" on every CLI run
    transformers.utils.logging.set_verbosity_error()
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=False, dtype=torch.float32,
            output_loading_info=True)
    except Exception as exc:  # noqa: BLE001 - missing weights, an unknown model_type, a bad file
        raise CheckpointError(f"{directory}: transformers cannot load it as a causal LM: "
                              f"{_first_line(exc)}") from None
    finally:
        transformers.utils.logging.set_verbosity(level)
        if bars:
            transformers.utils.logging.enable_progress_bar()
    _check_loading_info(info, directory)
    return model.eval()


def _check_loading_info(info: dict[str, Any], directory: Path) -> None:
    said = []
    for key, what in (("missing_keys", "weights the config expects are missing"),
                      ("unexpected_keys", "weights the config has no place for"),
                      ("mismatched_keys", "weights of another shape than the config's")):
        names = sorted(str(n if isinstance(n, str) else n[0]) for n in info.get(key) or ())
        if names:
            said.append(f"{len(names)} {what} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})")
    if said:
        raise CheckpointError(f"{directory}: its config.json and its weights disagree: {'; '.join(said)}")


def _tokenizer(transformers: Any, directory: Path, d_vocab: int) -> tuple[HFTokenizer | None, str | None]:
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        hint = ("the directory has no tokenizer files: save the model's tokenizer there "
                "(tokenizer.save_pretrained(DIR))")
        logger.warning("%s: loaded with token ids only; %s", directory, hint)
        return None, hint
    try:
        backend = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True,
                                                         trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - a garbled tokenizer.json, a missing sentencepiece
        raise CheckpointError(f"{directory}: its tokenizer does not load: {_first_line(exc)}") from None
    tokenizer = HFTokenizer(backend, directory)
    if tokenizer.vocab_size > d_vocab:
        raise CheckpointError(f"{directory}: the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                              f"vocabulary is {d_vocab}: they do not belong together")
    return tokenizer, None


def _ids_tokenizer(transformers: Any, d_vocab: int) -> Any:
    """A tokenizer reading "5 17 3" as ids [5, 17, 3]: the bridge boots only with one (else it
    asks the Hub for the model's own), and is left with none after."""
    import tokenizers

    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({str(i): i for i in range(d_vocab)}, unk_token="0"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class HFTokenizer(Tokenizer):
    """A Hugging Face tokenizer in our interface: text in, ids out, no special tokens added
    (the probes' windows cut text anywhere; a BOS only at the first would differ per window)."""

    kind = "huggingface"
    files = TOKENIZER_FILES

    def __init__(self, backend: Any, directory: Path | None = None) -> None:
        self.backend = backend
        self.directory = directory

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        ids = as_id_list(ids)
        self._check_ids(ids)
        return self.backend.decode(ids)

    @property
    def vocab_size(self) -> int:
        return len(self.backend)

    def id_to_piece(self, i: int) -> str:
        self._check_ids([i])
        return self.backend.convert_ids_to_tokens(int(i))

    def piece_to_id(self, piece: str) -> int:
        found = self.backend.get_vocab().get(piece)
        if found is None:
            raise UnknownTokenError(f"{piece!r} is not in the vocabulary")
        return int(found)

    def save(self, directory: str | Path) -> list[Path]:
        self.backend.save_pretrained(str(directory))
        return [p for p in Path(directory).iterdir() if p.name in TOKENIZER_FILES]

    @classmethod
    def load(cls, directory: str | Path) -> HFTokenizer:
        try:
            from transformers import AutoTokenizer

            return cls(AutoTokenizer.from_pretrained(str(directory), local_files_only=True,
                                                     trust_remote_code=False), Path(directory))
        except Exception as exc:  # noqa: BLE001
            raise TokenizerError(f"{directory}: {_first_line(exc)}") from None
