"""Logit lens: what each layer's residual stream would predict if the model stopped there.

    from probes import logit_lens
    result = logit_lens.run(model, tokens, k=5, tokenizer=tok)   # ours or a TransformerBridge
    result.kl_to_final, result.cross_entropy, result.target_rank   # one number per layer
    print(result.format())                                         # layer x position grid

Definition (DESIGN.md, "Probes"): the residual stream after the embedding
(`blocks.0.hook_resid_pre`), optionally mid-block (`blocks.{l}.hook_resid_mid`) and after every
block (`blocks.{l}.hook_resid_post`) is decoded exactly as the model decodes its last one: its own
final norm, recomputed on that vector (not the final layer's cached scale), then W_U (+ b_U where
the model has one). The series' models have no final norm, so there it is `resid @ W_out`. Per
layer and position: top-k tokens with probabilities, cross-entropy to the true next token
(targets tokens[:, 1:]; the last position has none: null), KL(final || layer) =
sum p_final (log p_final - log p_layer) in nats, and the target's rank (tokens with a strictly
higher logit; 0 = top-1). Per-layer numbers average over positions (KL over all, CE and rank over
positions with a target).

Memory: one forward; its hooks keep only each point's residual [batch pos d_model], which is
d_model/d_vocab of one layer's distribution (1/65 for GPT-2), so the L+1 residuals cost less than
one [batch pos d_vocab] layer whenever (L+1) d_model < d_vocab. Running the model first for the
final logits and reducing inside the hooks would need a second forward for the same memory.
After the forward, layers are decoded one at a time against the final distribution (kept as
probabilities [batch pos d_vocab]): peak is the model's logits, the final probabilities and one
layer's logits.

`LogitLens.decode(resid, layer_index)` is the one method a tuned lens overrides (e.g. a learned
per-layer affine translator applied before `super().decode`).
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from probes.args import logit_lens_parser
    logit_lens_parser().parse_early()

import logging
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from models.anatomy import AnatomyError, find_anatomy
from models.store.any_model import SavedModel
from models.tokenizers import token_piece
from probes.args import logit_lens_parser as build_parser
from probes.cli import Shown, run_probe
from probes.common import (ProbeInputError, as_batches, hook_names, model_device, progress_bar, token_batches,
                           tokens_or_text)
from probes.lens.result import LogitLensResult
from probes.lens.stats import FinalDistribution, LayerStats, layer_stats
from probes.sources.attention import has_lens_cfg
from probes.sources.tapped import longest_row

log = logging.getLogger(__name__)

READOUT_TOLERANCE = 1e-4  # the last layer must reproduce the model's logits; warn past this


# ---------------------------------------------------------------- the lens

@dataclass(frozen=True)
class LensPoint:
    label: str  # "embed", "0_mid", "0_post", ...
    hook: str  # "blocks.0.hook_resid_pre", ...


def lens_points(n_layers: int, include_mid: bool = False) -> list[LensPoint]:
    points = [LensPoint("embed", "blocks.0.hook_resid_pre")]
    for l in range(n_layers):
        if include_mid:
            points.append(LensPoint(f"{l}_mid", f"blocks.{l}.hook_resid_mid"))
        points.append(LensPoint(f"{l}_post", f"blocks.{l}.hook_resid_post"))
    return points


class LogitLens:
    """Decodes residual vectors through the model's own final norm and unembedding.

    `points` are the residual hook points read, in order; `decode(resid, i)` decodes a residual
    read at `points[i]`. A tuned lens subclasses this and overrides `decode` only.
    """

    def __init__(self, model: Any, include_mid: bool = False):
        self.model, self.anatomy = model, None
        if not has_lens_cfg(model):  # nanochat's GPT, a tutorial's: no hook points, read by its anatomy
            self._by_anatomy(model, include_mid)
            return
        n_layers = int(getattr(model.cfg, "n_layers", 0) or 0)
        if n_layers < 1 or "blocks.0.hook_resid_pre" not in hook_names(model):
            raise ProbeInputError(f"{type(model).__name__} has no residual stream to read (an MLP-family "
                                  f"model has no blocks): the logit lens needs a transformer")
        try:
            model.W_U  # read again in decode, so a lens follows the model across devices
        except (AttributeError, ValueError) as err:
            raise ProbeInputError(f"cannot decode the residual stream: {err}") from None
        self.final_norm = getattr(model, "ln_final", None)  # ours: present iff cfg.final_norm
        self.d_vocab, self.n_ctx = int(model.cfg.d_vocab), int(model.cfg.n_ctx)
        self.points = lens_points(n_layers, include_mid)
        missing = [p.hook for p in self.points if p.hook not in hook_names(model)]
        if missing:
            raise ProbeInputError(f"{type(model).__name__} has no hook point {missing[0]}")

    def _by_anatomy(self, model: Any, include_mid: bool) -> None:
        """No hook points: the blocks' inputs and outputs read with torch hooks, decoded through
        the model's own final norm and unembedding (`models.anatomy`)."""
        try:
            self.anatomy = find_anatomy(model)
        except AnatomyError as err:
            raise ProbeInputError(f"{type(model).__name__} has no hook points on its residual stream (ours and a "
                                  f"TransformerBridge's have them) and {str(err).split(' has ', 1)[1]}: the lenses "
                                  "cannot read it; the attention probes read it through the tap") from None
        if include_mid:
            raise ProbeInputError(f"{type(model).__name__} has no hook point between attention and MLP: the "
                                  "lens reads its residual stream after each block (leave out --mid)")
        self.final_norm, self.d_vocab, self.n_ctx = None, self.anatomy.d_vocab, self.anatomy.n_ctx
        self.points = lens_points(self.anatomy.n_layers)

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.points]

    def decode(self, resid: torch.Tensor, layer_index: int) -> torch.Tensor:
        """Logits of a residual read at points[layer_index]: [... d_model] -> [... d_vocab]."""
        if self.anatomy is not None:  # its own final norm, unembedding (and nanochat's softcap)
            return self.anatomy.decode(resid)
        x = resid if self.final_norm is None else self.final_norm(resid)  # norm recomputed on x
        logits = x @ self.model.W_U  # [... d_vocab]
        b_U = getattr(self.model, "b_U", None)
        return logits if b_U is None else logits + b_U


# ---------------------------------------------------------------- the runner

def lens_batch(model: Any, lens: LogitLens, tokens: torch.Tensor,
               k: int) -> tuple[list[LayerStats], float]:
    """One forward with residual-keeping hooks, then each point decoded against the final
    distribution. Returns per-point stats and max |lens(last point) - model logits|."""
    resid: dict[int, torch.Tensor] = {}

    def keep(index: int):
        def hook(x: torch.Tensor, hook: Any) -> None:  # x: [batch pos d_model]
            resid[index] = x.detach().clone()
        return hook

    fwd_hooks = [(p.hook, keep(i)) for i, p in enumerate(lens.points)]
    with torch.inference_mode():
        if lens.anatomy is not None:
            logits, kept = lens.anatomy.residuals(model, tokens)  # [batch pos d_vocab], per point
            resid.update(enumerate(kept))
        else:
            with model.hooks(fwd_hooks=fwd_hooks):
                logits = model(tokens)  # [batch pos d_vocab]
        final = FinalDistribution.from_logits(logits)
        last = len(lens.points) - 1
        last_logits = lens.decode(resid.pop(last), last)
        readout_error = float((last_logits.float() - logits.float()).abs().max())
        del logits
        stats: dict[int, LayerStats] = {last: layer_stats(last_logits, final, tokens, k)}
        del last_logits
        for i in range(last):
            stats[i] = layer_stats(lens.decode(resid.pop(i), i), final, tokens, k)
    return [stats[i] for i in range(last + 1)], readout_error


def run(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor], *, k: int = 5,
        include_mid: bool = False, tokenizer: Any = None, lens: LogitLens | None = None,
        batch_size: int = 16, progress: bool | None = None,
        source: str | None = None) -> LogitLensResult:
    """The logit lens of `model` (ours, a TransformerBridge, or any other module through its anatomy,
    `models.anatomy`: nanochat's GPT, a tutorial's, a Llama) on [batch pos] tokens; a snapshot of any
    model without its code reads the lens it saved (`probes.sources.saved`).

    Long rows are windowed to the model's context. The model runs in eval mode (restored after).
    `lens` defaults to `LogitLens(model, include_mid)`; pass a subclass for a tuned lens.
    `tokens` may be text, read with `tokenizer` (default `model.tokenizer`) as `--text` is.
    """
    if isinstance(model, SavedModel):  # a snapshot of any model without its code: the lens it saved
        from probes.sources.saved import saved_lens_result
        return saved_lens_result(model, tokens, k=k, include_mid=include_mid, tokenizer=tokenizer,
                                 batch_size=batch_size, source=source)
    tokens = tokens_or_text(model, tokens, tokenizer, batch_size)
    lens = lens or LogitLens(model, include_mid)
    if not isinstance(k, int) or k < 1:
        raise ProbeInputError(f"k must be a positive int, got {k!r}")
    if k > lens.d_vocab:
        raise ProbeInputError(f"-k {k} is more than the vocabulary's {lens.d_vocab} tokens")
    n_ctx = lens.n_ctx or longest_row(tokens) or 1  # a module naming no context: the rows as given
    batches = as_batches(tokens, n_ctx, lens.d_vocab, batch_size)
    device, was_training = model_device(model), model.training
    per_batch, errors = [], []
    model.eval()
    try:
        for batch in progress_bar(batches, progress, "logit lens"):
            stats, err = lens_batch(model, lens, batch.to(device), k)
            per_batch.append((batch.cpu(), [_to_cpu(s) for s in stats]))
            errors.append(err)
    finally:
        model.train(was_training)
    if tokenizer is None:
        tokenizer = getattr(model, "tokenizer", None)  # a TransformerBridge's HuggingFace tokenizer
    result = LogitLensResult(lens.labels, per_batch, max(errors), tokenizer, source)
    if type(lens) is LogitLens and result.readout_error > READOUT_TOLERANCE:
        log.warning("the lens at the last layer differs from the model's logits by %.3g: this model's "
                    "readout is not final norm + unembedding", result.readout_error)
    return result


def _to_cpu(s: LayerStats) -> LayerStats:
    return LayerStats(*(t.cpu() for t in (s.kl, s.cross_entropy, s.rank, s.top_probs, s.top_ids, s.finite)))


# ---------------------------------------------------------------- CLI

def cli_warnings(result: LogitLensResult) -> list[str]:
    """What the CLI says below the table: non-finite layers (named, only those), a final layer
    that makes every KL non-finite, and a text too short to have a next token."""
    lines = []
    bad = result.nonfinite_layers
    if bad:
        kl = "; KL to the final layer is not a number at any layer" if result.layers[-1] in bad else ""
        lines.append(f"the lens at {', '.join(bad)} is NaN or inf (a diverged model): cross-entropy, "
                     f"rank and top tokens are not numbers there (JSON shows null, top_k []){kl}")
    if all(len(row) < 2 for row in result.tokens):
        lines.append("the text is one token, which has no next token: cross-entropy and rank need "
                     "at least two tokens (they show nan; JSON null)")
    return lines


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> Shown:
    from models.checkpoint import load_from_args
    snap = load_from_args(args)
    # refuses models without a residual stream first; a snapshot without its code reads what it saved
    lens = None if isinstance(snap.model, SavedModel) else LogitLens(snap.model, args.mid)
    n_ctx = (lens.n_ctx if lens is not None else None) or int(snap.config.n_ctx)
    batches, source = token_batches(args, snap.tokenizer, n_ctx, snap)
    result = run(snap.model, batches, k=args.k, tokenizer=snap.tokenizer, lens=lens,
                 batch_size=args.batch_size, progress=args.progress, source=source)
    return Shown.of(result, lambda: result.format(args.columns), warnings=cli_warnings(result))


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
