"""Attention of any other `nn.Module` mapping [batch pos] ids to logits, read by the attention tap
(`models.tap`): nanochat's GPT, a Hugging Face model passed as itself, the GPTs tutorials write.

The one check is one forward pass on a short window of token 0 (PROBE_LEN tokens): it learns the
layers, heads and vocabulary, and refuses in one line a model the tap cannot read (no attention
call, a FlashAttention kernel, weights on the meta device, a forward that raises). The context
comes from `models.tap_inputs.context_of` (its config, its position table, its causal-mask
buffer), else the context the caller read elsewhere (`context=`: a snapshot's recorded `n_ctx`, as
the CLIs give for a model rebuilt with `--model-code`), else the longest row of the tokens given;
windows are cut to it, and `context_said` is the one line saying where it came from when the model
itself did not name it (None when it did).

Sliding windows: from the Hugging Face config where the module has one (`config_windows`), and
from each call the tap reads: a layer whose rows see fewer keys than causal attention gives them
(the most any row sees, counted from the call's own mask: -inf scores) has that window, as the
Monitor records it (`train.monitor.tap`). nanochat's short-window layers pass SDPA a boolean
mask of window + 1 keys; Mistral's a mask of `sliding_window` keys.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

from models.tap import AttentionCall, StopTap, TapError, tap_forward
from models.tap_inputs import context_of
from probes.errors import ProbeInputError
from probes.sources.attention import AttentionSource, ModelDims, Reduce, checked_device, stop_after
from probes.sources.hooked import config_windows

PROBE_LEN = 8  # tokens of the window the one check reads a model's shape from
FAILURES = (TypeError, IndexError, RuntimeError, ValueError, KeyError, AttributeError)  # a forward's own


class FromReduce(Exception):
    """What a reducer raised inside the model's forward, carried out as its __cause__."""


def longest_row(tokens: Any) -> int | None:
    """The longest row of [batch pos] tokens or of a list of such batches; None if unknown."""
    if isinstance(tokens, torch.Tensor):
        return int(tokens.shape[-1]) if tokens.dim() else None
    if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, torch.Tensor) for t in tokens):
        return max(int(t.shape[-1]) for t in tokens if t.dim())
    return None


def seen_window(call: AttentionCall) -> int | None:
    """The keys the call's last row may see (the most any row of a causal or sliding-window mask
    sees), where that is fewer than its keys: the window."""
    last = call.scores[..., -1, :]  # [batch head k], -inf where masked
    seen = int((last > -math.inf).sum(-1).amax())
    return seen if 0 < seen < call.scores.shape[-1] else None


class TappedSource(AttentionSource):
    """Any module through the tap; `tokens` give the context where the model names none."""

    kind = "tap"

    def __init__(self, model: torch.nn.Module, tokens: Any = None, context: int | None = None):
        self.model, self.name = model, type(model).__name__
        self.device = checked_device(model)
        given = longest_row(tokens)
        context, self.context_said = self.context_from(context_of(model), context, given)
        n = max(1, min(PROBE_LEN, context or given or PROBE_LEN, given or PROBE_LEN))
        self.windows: dict[int, int] = {}
        result = self.forward(torch.zeros(1, n, dtype=torch.long, device=self.device), self.learn)
        if len(set(result.n_heads)) > 1:
            raise ProbeInputError(f"{self.name}'s attention layers have {result.n_heads} heads: the probes read "
                                  "models whose layers have the same number of heads")
        self.dims = ModelDims(len(result.layers), result.n_heads[0], context or given or n,
                              int(result.logits.shape[-1]))
        self.windows = {**config_windows(getattr(model, "config", None), self.dims.n_layers), **self.windows}

    def context_from(self, own: int | None, recorded: int | None, given: int | None) -> tuple[int | None, str | None]:
        """(context, the line saying where it came from): the model's own, else the recorded one,
        else the tokens' longest row; the line None when the model named it."""
        if own:
            return own, None
        names = f"{self.name} names no context (no config, max_seq_len, position table or causal mask found)"
        if recorded:
            return recorded, f"{names}: windows of {recorded} tokens, the context its snapshot recorded"
        if given:
            return given, f"{names}: windows of {given} tokens, the length of the longest row given"
        return None, f"{names}: windows of {PROBE_LEN} tokens; give the text to read it whole"

    def learn(self, call: AttentionCall) -> None:
        """A call's window, if its mask shows one (kept: a shorter batch shows none)."""
        window = seen_window(call)
        if window is not None:
            self.windows[call.layer] = max(window, self.windows.get(call.layer, 0))

    def forward(self, ids: torch.Tensor, reduce: Any) -> Any:
        """tap_forward, its refusals and the model's own errors as one line each (what `reduce`
        raises passes through as it is)."""
        def guarded(call: AttentionCall) -> Any:
            try:
                return reduce(call)
            except StopTap:
                raise
            except Exception as err:  # noqa: BLE001 - carried past the model's forward untouched
                raise FromReduce() from err

        try:
            return tap_forward(self.model, ids, guarded)
        except FromReduce as err:
            raise err.__cause__ from None  # type: ignore[misc]
        except TapError as err:
            raise ProbeInputError(str(err)) from None
        except FAILURES as err:
            first = (str(err).strip().splitlines() or [""])[0]
            raise ProbeInputError(f"{self.name}'s forward failed on {ids.shape[1]} tokens ({type(err).__name__}: "
                                  f"{first}); if its context is shorter, give it shorter rows") from None

    def each_layer_pattern(self, batch: torch.Tensor, layers: Iterable[int], reduce: Reduce) -> int:
        take, done = stop_after(list(layers), reduce)

        def call(c: AttentionCall) -> None:
            self.learn(c)
            if take(c.layer, c.pattern):
                raise StopTap

        self.forward(batch, call)
        return done[0]
