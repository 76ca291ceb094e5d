"""Frozen, self-validating model configs, one per family, saved inside every checkpoint.

`TransformerConfig` covers the whole attention line of the series through switches (attention
scale, residual, heads and d_head, norm and placement, MLP depth, ...). `MLPConfig` is the
series' first model: concatenated character embeddings fed to a plain MLP.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

ATTN_SCALES = ("none", "sqrt_d_model", "sqrt_d_head")
NORMS = ("none", "rms", "layer")
# fields added to the configs after they were first saved, each with the value that means "as
# before": a config saved without one reads as that value, and identities (a tuned lens's config
# hash) leave it out at that value, so artefacts made before it still match
ADDED_FIELDS = {"qk_norm": "none", "unembed_init_scale": 1.0}
NORM_PLACEMENTS = ("pre", "post")
ACT_FNS = ("relu", "gelu", "gelu_tanh", "tanh")  # gelu: exact (nanoGPT); gelu_tanh: GPT-2's gelu_new
POS_EMBEDS = ("learned", "none")
UNEMBEDS = ("separate", "tied", "mlp")
INITS = ("series_unscaled", "series", "gpt", "gpt2")


def _check_positive(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{type(cfg).__name__}.{name} must be a positive int, got {value!r}")


def _check_choice(cfg: Any, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in choices:
        raise ValueError(f"{type(cfg).__name__}.{name} must be one of {choices}, got {value!r}")


def _check_bool(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            raise ValueError(f"{type(cfg).__name__}.{name} must be true or false, got {value!r}")


def _check_fraction(cfg: Any, name: str) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{type(cfg).__name__}.{name} must be in [0, 1), got {value!r}")


def _check_scale(cfg: Any, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{type(cfg).__name__}.{name} must be a finite number > 0, got {value!r}")


class _ConfigBase:
    family: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict including the family tag; `config_from_dict` inverts it."""
        return {"family": self.family, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    def replace(self, **changes: Any):
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class TransformerConfig(_ConfigBase):
    """The series' attention models and GPT-style transformers.

    residual=False reproduces the series' first attention nets (x = attn(x); logits = mlp(x));
    unembed="mlp" means the last MLP maps straight to the vocabulary (there is no W_out).
    """

    family: ClassVar[str] = "transformer"

    d_vocab: int
    n_ctx: int
    d_model: int
    n_layers: int
    n_heads: int
    d_head: int
    d_mlp: int
    mlp_depth: int = 1  # hidden layers per MLP: the series uses 2 (net.0, net.2, net.4)
    act_fn: str = "relu"
    attn_scale: str = "sqrt_d_model"
    residual: bool = True
    norm: str = "none"
    norm_placement: str = "pre"
    norm_eps: float = 1e-6
    norm_bias: bool = True  # LayerNorm's additive beta (nanoGPT's bias=False drops it)
    final_norm: bool = False
    attn_out_proj: bool = True  # W_O; the series' single-head nets have none
    attn_bias: bool = False  # biases on Q, K, V and W_O
    attn_out_bias: bool = False  # a bias on W_O alone (nanoGPT's attention projection)
    mlp_bias: bool = True
    pos_embed: str = "learned"
    unembed: str = "separate"
    unembed_bias: bool = False  # logits = resid @ W_out + b_out, like an nn.Linear lm_head
    dropout: float = 0.0
    init: str = "series"
    # queries and keys normalised per head (over d_head, one gain shared by the heads) before the
    # dot product: the fix for attention-logit growth (Dehghani et al. 2023; Wortsman et al. 2023)
    qk_norm: str = "none"
    # the layer that makes the logits initialised this many times smaller, its bias zero (0.01:
    # makemore's fix for a high initial loss: the first predictions start near uniform)
    unembed_init_scale: float = 1.0

    def __post_init__(self) -> None:
        _check_positive(self, "d_vocab", "n_ctx", "d_model", "n_layers", "n_heads", "d_head",
                        "d_mlp", "mlp_depth")
        for name, choices in (("act_fn", ACT_FNS), ("attn_scale", ATTN_SCALES), ("norm", NORMS), ("qk_norm", NORMS),
                              ("norm_placement", NORM_PLACEMENTS), ("pos_embed", POS_EMBEDS),
                              ("unembed", UNEMBEDS), ("init", INITS)):
            _check_choice(self, name, choices)
        _check_bool(self, "residual", "norm_bias", "final_norm", "attn_out_proj", "attn_bias", "attn_out_bias",
                    "mlp_bias", "unembed_bias")
        _check_fraction(self, "dropout")
        _check_scale(self, "unembed_init_scale")
        if self.unembed == "tied" and self.unembed_init_scale != 1.0:
            raise ValueError("TransformerConfig.unembed_init_scale needs its own unembedding: a tied one is "
                             "the embedding, which it would shrink too; use unembed='separate'")
        if not isinstance(self.norm_eps, (int, float)) or not 0 < self.norm_eps < float("inf"):
            raise ValueError(f"TransformerConfig.norm_eps must be a finite number > 0, got {self.norm_eps!r}")
        if self.final_norm and self.norm == "none":
            raise ValueError("TransformerConfig.final_norm=True needs norm 'rms' or 'layer', got norm='none'")
        if not self.attn_out_proj and self.n_heads * self.d_head != self.d_model:
            raise ValueError(
                "TransformerConfig.attn_out_proj=False needs n_heads * d_head == d_model, got "
                f"{self.n_heads} * {self.d_head} != {self.d_model}")
        if self.unembed == "mlp" and (self.residual or self.n_layers != 1):
            raise ValueError("TransformerConfig.unembed='mlp' (the MLP maps to the vocabulary) needs "
                             f"residual=False and n_layers=1, got residual={self.residual}, "
                             f"n_layers={self.n_layers}")
        if self.unembed == "mlp" and self.unembed_bias:
            raise ValueError("TransformerConfig.unembed_bias=True needs an unembedding matrix, "
                             "got unembed='mlp' (the MLP's own bias plays that role)")
        if self.attn_out_bias and not self.attn_out_proj:
            raise ValueError("TransformerConfig.attn_out_bias=True needs attn_out_proj=True")
        if self.unembed == "mlp" and (self.final_norm or
                                      (self.norm != "none" and self.norm_placement == "post")):
            raise ValueError("TransformerConfig.unembed='mlp' leaves d_vocab-wide activations, which a "
                             "final norm or a post-placed norm (d_model wide) cannot take")

    @property
    def has_out_bias(self) -> bool:
        """Whether W_O carries a bias b_O."""
        return self.attn_out_proj and (self.attn_bias or self.attn_out_bias)

    @property
    def d_attn(self) -> int:
        """Width of the concatenated heads, the input of W_O."""
        return self.n_heads * self.d_head

    # TransformerLens' names for what ActivationCache reads (cache.apply_ln_to_stack, ...)
    @property
    def normalization_type(self) -> str | None:
        return {"none": None, "layer": "LN", "rms": "RMS"}[self.norm]

    @property
    def attn_only(self) -> bool:
        return False  # every block has an MLP

    @property
    def default_prepend_bos(self) -> bool:
        return False  # our tokenizers have no BOS token


@dataclass(frozen=True)
class MLPConfig(_ConfigBase):
    """The series' concat-embedding MLP LM: n_ctx token embeddings side by side, then an MLP."""

    family: ClassVar[str] = "mlp"

    d_vocab: int
    n_ctx: int  # tokens in one input window
    d_embed: int
    d_hidden: int
    n_hidden_layers: int = 1
    act_fn: str = "relu"
    dropout: float = 0.0
    unembed_init_scale: float = 1.0  # the output layer initialised this many times smaller, bias zero

    def __post_init__(self) -> None:
        _check_positive(self, "d_vocab", "n_ctx", "d_embed", "d_hidden", "n_hidden_layers")
        _check_choice(self, "act_fn", ACT_FNS)
        _check_fraction(self, "dropout")
        _check_scale(self, "unembed_init_scale")

    @property
    def d_input(self) -> int:
        return self.n_ctx * self.d_embed


ModelConfig = TransformerConfig | MLPConfig
CONFIG_FAMILIES: dict[str, type] = {"transformer": TransformerConfig, "mlp": MLPConfig}


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """Inverse of `to_dict`: raises ValueError naming an unknown family or field."""
    if not isinstance(data, dict):
        raise ValueError(f"model config must be a JSON object, got {type(data).__name__}")
    data = dict(data)
    family = data.pop("family", None)
    if family not in CONFIG_FAMILIES:
        raise ValueError(f"unknown model family {family!r}; expected one of {sorted(CONFIG_FAMILIES)}")
    cls = CONFIG_FAMILIES[family]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {family} config field(s) {unknown}; known: family, "
                         f"{', '.join(f.name for f in dataclasses.fields(cls))}")
    missing = sorted(f.name for f in dataclasses.fields(cls)
                     if f.name not in data and f.default is dataclasses.MISSING)
    if missing:
        raise ValueError(f"{family} config is missing field(s) {missing}")
    return cls(**data)
