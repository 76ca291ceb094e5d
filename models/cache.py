"""TransformerLens habits on our models: `run_with_cache` gives an `ActivationCache`.

`cache["pattern", 0]`, `accumulated_resid()`, `decompose_resid()`, `stack_head_results()`,
`apply_ln_to_stack()` and `logit_attrs()` read the model's `cfg` (see `TransformerConfig`'s
TransformerLens fields), `blocks[l].attn.W_O` and, for logit attribution, `W_U` and the
tokenizer. Our state dicts keep the series' per-head names; in memory each layer's q/k/v sit in
one packed parameter (`models.packed_heads`), and the TransformerLens shapes are built on each
access (W_Q/W_K/W_V as views of it, W_O and the per-layer stacks as new tensors):

    model.blocks[l].attn.W_Q   [head d_model d_head]     model.W_Q   [layer head d_model d_head]
    model.blocks[l].attn.W_O   [head d_head d_model]     model.W_O   [layer head d_head d_model]
    model.blocks[l].attn.b_O   [d_model]                 model.b_O   [layer d_model]
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_lens import ActivationCache
from transformer_lens.utilities import Slice

from models.store.result import text_to_tokens


class ScratchCache(ActivationCache):
    """An ActivationCache that knows two things TransformerLens' models never do: a model
    without a final norm (the series': the residual goes straight to W_out) and norms placed
    after each sublayer (then no cached scale belongs to a layer's input)."""

    def apply_ln_to_stack(self, residual_stack: torch.Tensor, layer: int | None = None,
                          mlp_input: bool = False, pos_slice: Any = None, batch_slice: Any = None,
                          has_batch_dim: bool = True, recompute_ln: bool = False) -> torch.Tensor:
        cfg = self.model.cfg
        if cfg.norm != "none" and cfg.norm_placement == "post":
            raise ValueError("apply_ln needs norms before each sublayer; this model has "
                             "norm_placement='post', so no norm scale belongs to a layer's input")
        if layer in (None, -1, cfg.n_layers) and not cfg.final_norm:
            # nothing stands between the last block and the unembedding: identity
            batch_slice = batch_slice if isinstance(batch_slice, Slice) else Slice(batch_slice)
            return batch_slice.apply(residual_stack, dim=1) if has_batch_dim else residual_stack
        return super().apply_ln_to_stack(residual_stack, layer, mlp_input, pos_slice, batch_slice,
                                         has_batch_dim, recompute_ln)


class AttentionWeights:
    """`blocks[l].attn`: one Attention's weights in TransformerLens shapes (built on access);
    any other attribute (hook points, `heads`, `impl`) is the module's own."""

    def __init__(self, attention: torch.nn.Module):
        self.module = attention

    def __getattr__(self, name: str) -> Any:
        if name == "module":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.module, name)

    def __repr__(self) -> str:
        return f"AttentionWeights({self.module.cfg.n_heads} heads, d_head {self.module.cfg.d_head})"

    def _stack_or_zeros(self, name: str) -> torch.Tensor:
        if hasattr(self.module.heads[0], name):
            return self.module.stacked(name)
        return self.module.W_QKV.new_zeros(self.module.cfg.n_heads, self.module.cfg.d_head)  # no biases

    W_Q = property(lambda self: self.module.stacked("W_Q"), doc="[head d_model d_head]")
    W_K = property(lambda self: self.module.stacked("W_K"), doc="[head d_model d_head]")
    W_V = property(lambda self: self.module.stacked("W_V"), doc="[head d_model d_head]")
    b_Q = property(lambda self: self._stack_or_zeros("b_Q"), doc="[head d_head]")
    b_K = property(lambda self: self._stack_or_zeros("b_K"), doc="[head d_head]")
    b_V = property(lambda self: self._stack_or_zeros("b_V"), doc="[head d_head]")

    @property
    def W_O(self) -> torch.Tensor:
        """[head d_head d_model]; without an output projection each head writes its own slice."""
        return self.module.per_head_W_O()

    @property
    def b_O(self) -> torch.Tensor:
        """[d_model], zeros when W_O has no bias (or there is no W_O)."""
        if self.module.cfg.has_out_bias:
            return self.module.b_O
        return self.module.W_QKV.new_zeros(self.module.cfg.d_model)


class BlockTLNames:
    """Mixin for a block: `attn` as TransformerLens names it (the module is `attention`)."""

    @property
    def attn(self) -> AttentionWeights:
        return AttentionWeights(self.attention)


class CacheMixin:
    """Mixin for a HookedRootModule: run_with_cache returns an ActivationCache, text goes in
    through `model.tokenizer` (attached by checkpoint loading; not a submodule)."""

    tokenizer: Any = None

    def to_tokens(self, text: str) -> torch.Tensor:
        """Text as [1 pos] ids on the model's device, through `model.tokenizer`."""
        device = next(self.parameters()).device
        return text_to_tokens(self.tokenizer, text, device, type(self).__name__)

    def to_single_token(self, piece: str) -> int:
        tokens = self.to_tokens(piece)
        if tokens.numel() != 1:
            raise ValueError(f"{piece!r} is {tokens.numel()} tokens, not one")
        return int(tokens.item())

    def run_with_cache(self, *model_args: Any, return_cache_object: bool = True,
                       remove_batch_dim: bool = False, **kwargs: Any) -> tuple[Any, Any]:
        """As TransformerLens: (output, ActivationCache), or a plain dict with
        `return_cache_object=False`; `names_filter`, `remove_batch_dim`, `pos_slice` as there.
        The first argument may be text when the model has a tokenizer."""
        if model_args and isinstance(model_args[0], str):
            model_args = (self.to_tokens(model_args[0]), *model_args[1:])
        out, cache_dict = super().run_with_cache(*model_args, remove_batch_dim=remove_batch_dim, **kwargs)
        if not return_cache_object:
            return out, cache_dict
        cache_type = ScratchCache if getattr(self.cfg, "family", "") == "transformer" else ActivationCache
        return out, cache_type(cache_dict, self, has_batch_dim=not remove_batch_dim)


class TLWeights(CacheMixin):
    """Mixin for the transformer: TransformerLens' stacked weights and residual directions."""

    def _per_layer(self, name: str) -> torch.Tensor:
        return torch.stack([getattr(block.attn, name) for block in self.blocks])

    W_Q = property(lambda self: self._per_layer("W_Q"), doc="[layer head d_model d_head]")
    W_K = property(lambda self: self._per_layer("W_K"), doc="[layer head d_model d_head]")
    W_V = property(lambda self: self._per_layer("W_V"), doc="[layer head d_model d_head]")
    W_O = property(lambda self: self._per_layer("W_O"), doc="[layer head d_head d_model]")
    b_O = property(lambda self: self._per_layer("b_O"), doc="[layer d_model]")
    W_E = property(lambda self: self.embedding.weight, doc="[d_vocab d_model]")

    def tokens_to_residual_directions(self, tokens: str | int | torch.Tensor) -> torch.Tensor:
        """The unembedding columns of `tokens`: [*tokens.shape d_model] ([d_model] for one)."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        if isinstance(tokens, torch.Tensor) and tokens.numel() > 1:
            return self.W_U[:, tokens].movedim(0, -1)
        return self.W_U[:, int(tokens)]
