"""The config of a model we read but never rebuild (a Hugging Face causal LM through the bridge,
nanochat's own GPT): its shape in our words, for the CLIs, ``models.info`` and the app. Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.store.files import CheckpointError, read_json_object
from models.store.hf_weights import safetensors_header

__all__ = ["BRIDGE_SOURCE", "ForeignConfig", "hf_shape", "refuse_custom_code", "safetensors_param_count"]

BRIDGE_SOURCE = "huggingface-bridge"  # meta["source"] of a snapshot read through TransformerBridge


@dataclass(frozen=True)
class ForeignConfig:
    """What the probes and the app ask of a model's shape: layers, heads, context, vocabulary."""

    architecture: str  # "llama", "qwen2", "nanochat": what builds it
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    n_ctx: int
    d_vocab: int
    n_params: int | None = None  # from the weights' shapes where known before building
    unembed: str = "separate"  # or "tied" (lm_head is the embedding), in our configs' words
    family: str = "transformer"

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads if self.n_heads else 0  # 0 heads: a model read without attention

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def safetensors_param_count(path: Path) -> int | None:
    """Elements in a .safetensors file, from its JSON header alone: the app's parameter count
    without reading the weights. None where unreadable."""
    try:
        header = safetensors_header(path)
    except CheckpointError:
        return None
    total = 0
    for entry in header.values():
        count = 1
        for size in entry.get("shape", []):
            count *= int(size)
        total += count
    return total


CAUSAL = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")  # causal-LM classes (and Gemma 3's text+image)

# the names architectures use for one quantity, first found wins
_NAMES = {"n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
          "n_heads": ("num_attention_heads", "n_head"),
          "d_model": ("hidden_size", "n_embd", "d_model"),
          "n_ctx": ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"),
          "d_vocab": ("vocab_size",)}


def check_causal(data: dict[str, Any], source: Path) -> None:
    """A causal (decoder-only) language model's config: a seq2seq model or an encoder (BertModel:
    transformers would load it as BertLMHeadModel, attending both ways) is refused in one line."""
    kind = data.get("model_type")
    if data.get("is_encoder_decoder") is True:
        raise CheckpointError(f"{source}: model_type {kind!r} is a seq2seq (encoder-decoder) model; the probes "
                              "read causal (decoder-only) language models")
    names = data.get("architectures")
    if isinstance(names, list) and names and not any(isinstance(n, str) and n.endswith(CAUSAL) for n in names):
        raise CheckpointError(f"{source}: architectures {names} (model_type {kind!r}) is not a causal language "
                              f"model (a class ending in {' or '.join(CAUSAL)}); the probes read causal "
                              "(decoder-only) language models")


CODE_CONFIGS = ("config.json", "tokenizer_config.json")  # where an auto_map points transformers at .py files


def refuse_custom_code(data: dict[str, Any], directory: Path) -> None:
    """A folder whose config.json (`data`) or tokenizer_config.json has an ``auto_map`` asks
    transformers to import the .py files beside it (it prompts "run the custom code? [y/N]" and runs
    them on a y): refused in one line before transformers is called, whatever stdin holds."""
    for name in CODE_CONFIGS:
        found = data if name == "config.json" else _json_or_none(directory / name)
        if isinstance(found, dict) and "auto_map" in found:
            raise CheckpointError(f"{directory / name}: auto_map names code of the folder's own "
                                  f"({_code_names(found['auto_map'])}); scratchscope never runs a checkpoint's "
                                  "code (trust_remote_code=False): load that model yourself and give it to the probes")


def _json_or_none(path: Path) -> Any:
    return read_json_object(path) if path.is_file() else None


def _code_names(auto_map: Any) -> str:
    names = list(auto_map.values()) if isinstance(auto_map, dict) else [auto_map]
    flat = [str(n) for v in names for n in (v if isinstance(v, list) else [v]) if n]
    return ", ".join(flat[:3])[:200] or "an empty map"


def hf_shape(data: dict[str, Any], directory: Path) -> ForeignConfig:
    """The shape a Hugging Face config.json (`data`, in `directory`) describes, weights unread
    (the parameter count is the safetensors header's)."""
    source = directory / "config.json"
    check_causal(data, source)
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    found: dict[str, int] = {}
    for ours, names in _NAMES.items():
        value = next((text[n] for n in names if n in text), None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{source}: no positive integer {' / '.join(names)} "
                                  f"(model_type {data.get('model_type')!r})")
        found[ours] = value
    kv = text.get("num_key_value_heads")
    weights = directory / "model.safetensors"
    tied = data.get("tie_word_embeddings", text.get("tie_word_embeddings")) is True
    return ForeignConfig(architecture=str(data.get("model_type")), n_kv_heads=kv if isinstance(kv, int) and kv > 0
                         else found["n_heads"], n_params=safetensors_param_count(weights) if weights.is_file()
                         else None, unembed="tied" if tied else "separate", **found)
