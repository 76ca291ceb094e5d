"""The one way a model's attention reaches a probe: an `AttentionSource`, made once per run by
`probes.sources.source_of(model, tokens)` from what the runner was given, which checks the model
once and knows its dims, device and sliding windows; the probe then reads patterns from it.

    attn = source_of(model, tokens)              # ours, a bridge, any nn.Module, or a source itself
    attn.dims                                    # ModelDims(n_layers, n_heads, n_ctx, d_vocab)
    for batch in attn.batches(tokens, 16):       # [batch pos] windows of at most n_ctx, on attn.device
        attn.each_layer_pattern(batch, [0, 1], reduce)   # reduce(layer, pattern [batch head q k])

Kinds (each one class): `probes.sources.hooked.HookedSource` (our hook points and a
TransformerBridge's, `blocks.{l}.attn.hook_pattern`), `probes.sources.tapped.TappedSource` (any
other module mapping [batch pos] ids to logits, through `models.tap`); a saved snapshot's
readings (patterns recorded at save time on a fixed sample of tokens, for a model whose code is
not at hand) is one more subclass: set `name`, `dims`, `device`, `windows` in `__init__`,
implement `each_layer_pattern`, and override `batches` to hand back the saved sample.

Windows: `windows[layer] = w` for a layer with a sliding window, where query row i sees keys
max(0, i - w + 1) .. i, so k_i = min(i + 1, w) keys (`visible_keys`); a layer absent sees every
earlier key (k_i = i + 1). Normalised entropy, verdicts and the app's grid judge each row
against its k_i (DESIGN.md, "Attention entropy"). A source may add a layer's window while it
reads (the tap counts the keys each call's mask lets a row see), always before that layer's
pattern reaches `reduce`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Sequence

import torch

from probes.common import as_batches
from probes.errors import ProbeInputError

Reduce = Callable[[int, torch.Tensor], None]  # (layer, pattern [batch head q k])


@dataclass(frozen=True)
class ModelDims:
    n_layers: int
    n_heads: int
    n_ctx: int
    d_vocab: int


def visible_keys(n: int, window: int | None = None, device: Any = None) -> torch.Tensor:
    """k_i, the keys row i of a causal pattern may see, for rows 0..n-1: [n] float64,
    min(i + 1, window) in a sliding-window layer, i + 1 otherwise."""
    keys = torch.arange(1, n + 1, dtype=torch.float64, device=device)
    return keys if window is None else keys.clamp_(max=window)


def hooked(model: Any) -> bool:
    """Ours or a TransformerBridge: attention read at its hook points (else through the tap)."""
    return "blocks.0.attn.hook_pattern" in getattr(model, "hook_dict", {})


def has_lens_cfg(model: Any) -> bool:
    """A TransformerLens-style cfg (ours, a bridge's): dims come from it, not from a forward."""
    cfg = getattr(model, "cfg", None)
    return cfg is not None and hasattr(cfg, "n_ctx") and hasattr(cfg, "d_vocab")


def checked_device(model: Any) -> torch.device:
    """The device of the model's parameters (the CPU for a model without any), in one walk over
    them; weights on the meta device (built but never loaded) are refused in one line."""
    params = list(model.parameters())
    if any(p.is_meta for p in params):
        raise ProbeInputError(f"{type(model).__name__}'s weights are on the meta device (built, never loaded): "
                              "load them first (model.to_empty(device=...) then load_state_dict)")
    return params[0].device if params else torch.device("cpu")


class AttentionSource(ABC):
    """A model's attention as the probes read it; see the module's docstring."""

    kind: str = "source"
    name: str  # the model's class name, for the reports
    dims: ModelDims
    device: torch.device  # where each batch goes before `each_layer_pattern`
    windows: dict[int, int]  # layer -> sliding window w (k_i = min(i + 1, w)); absent: causal
    model: Any = None  # the module read, where there is one (per-head weights, the OV circuit)
    # (tokens [samples 2*length], length): the random repeat a saved source holds, which
    # `probes.heads.run_repeat` reads instead of drawing new tokens (None: draw them)
    fixed_repeat: tuple[torch.Tensor, int] | None = None

    @abstractmethod
    def each_layer_pattern(self, batch: torch.Tensor, layers: Iterable[int], reduce: Reduce) -> int:
        """One no-grad pass over `batch` [batch pos] (on `device`): `reduce(layer, pattern)` with
        pattern [batch head q k] for each of `layers`, in order, a layer's window in `windows`
        before its call; nothing is read past the last wanted layer. Returns how many layers
        were reduced."""

    def batches(self, tokens: Any, batch_size: int = 16) -> list[torch.Tensor]:
        """`tokens` ([batch pos] ids or a list of such batches) as [batch pos] batches of windows of
        at most `dims.n_ctx`, ids checked against the vocabulary (moved to `device` by the reader)."""
        if tokens is None:
            raise ProbeInputError("no tokens: give [batch pos] token ids or text")
        return as_batches(tokens, self.dims.n_ctx, self.dims.d_vocab, batch_size)

    def reading(self) -> ContextManager[Any]:
        """Entered around a run's passes (our models: eval mode, put back after)."""
        return nullcontext()

    def check(self, layer: int | None = None, head: int | None = None) -> None:
        """A chosen layer / head within the model's, else one line naming the range."""
        if layer is not None and not 0 <= layer < self.dims.n_layers:
            raise ProbeInputError(f"layer {layer} is out of range: the model has layers 0..{self.dims.n_layers - 1}")
        if head is not None and not 0 <= head < self.dims.n_heads:
            raise ProbeInputError(f"head {head} is out of range: the model has heads 0..{self.dims.n_heads - 1}")

    def chosen(self, layer: int | None = None, head: int | None = None) -> tuple[list[int], list[int]]:
        """The layers and heads a report covers: the one chosen, else all (checked)."""
        self.check(layer, head)
        return ([*range(self.dims.n_layers)] if layer is None else [layer],
                [*range(self.dims.n_heads)] if head is None else [head])

    def describe(self) -> str:
        d = self.dims
        return f"{self.name}(n_layers={d.n_layers}, n_heads={d.n_heads}, n_ctx={d.n_ctx})"


def stop_after(layers: Sequence[int], reduce: Reduce) -> tuple[Callable[[int, torch.Tensor], bool], list[int]]:
    """A per-layer taker for a pass over every layer: it reduces the wanted ones and says (True)
    when the last wanted one is done, so the pass can end there; `done[0]` counts them."""
    wanted, last, done = set(layers), max(layers), [0]

    def take(layer: int, pattern: torch.Tensor) -> bool:
        if layer in wanted:
            reduce(layer, pattern)
            done[0] += 1
        return layer == last
    return take, done
