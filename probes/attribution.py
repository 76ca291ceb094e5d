"""Direct logit attribution: each head's and each MLP's direct contribution to one logit.

    from probes import attribution
    result = attribution.run(model, "ROMEO:", position=-1)            # ours or a TransformerBridge
    result = attribution.run(model, tokens, position=3, target="e", versus=" ")
    result.heads[layer][head], result.mlps[layer], result.total == result.logit

Definition: the final residual at the position is a sum of components (token embedding,
positional embedding, every head's output z_h W_O_h, every MLP's output (a gated MLP's too), and
the attention output biases summed over layers: zero in a model without them, as Llama's). The final norm is linear in its input once its scale is fixed, so, as
TransformerLens's `ActivationCache.logit_attrs` computes it, each component c contributes
    ((c - mean(c)) / scale) . (gamma * W_U[:, target])        (LayerNorm; RMSNorm: no mean)
with `scale` the final norm's cached `hook_scale` at the position (TransformerLens folds gamma into
W_U; ours keeps it in the norm, so it is multiplied in here). The norm's beta and the unembedding
bias form one more row, `final_bias` = beta . W_U[:, target] + b_U[target]; then the rows sum to the
target's logit. A model without a final norm has scale 1 and gamma 1. With `versus`, every row is
the difference of the two tokens' rows and the sum is the logit difference.
"""

from __future__ import annotations

if __name__ == "__main__":  # --help and bad arguments answered before torch is imported (~4 s)
    from probes.args import attribution_parser
    attribution_parser().parse_early()

import logging
from dataclasses import dataclass
from typing import Any

import torch

from models.tokenizers import token_piece
from probes.args import attribution_parser as build_parser
from probes.cli import Shown, run_probe
from probes.common import (ProbeInputError, as_batches, default_windows, eval_mode, hook_names,
                           model_device, model_tokenizer, no_tokenizer, to_jsonable, tokens_or_text)
from probes.neighbours import resolve_token
from probes.sources.attention import has_lens_cfg
from probes.sources.hooked import HookedSource

log = logging.getLogger(__name__)

SUM_TOLERANCE = 1e-4  # the rows must add up to the model's logit; warn past this


# ---------------------------------------------------------------- pure functions

def head_outputs(z: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """Each head's write into the residual: z [head d_head], W_O [head d_head d_model] -> [head d_model]."""
    return torch.einsum("hd,hdm->hm", z, W_O)


def direct_attributions(components: torch.Tensor, scale: torch.Tensor | float, direction: torch.Tensor,
                        center: bool) -> torch.Tensor:
    """components [c d_model] through a fixed final norm onto a direction [d_model] (or [d_model k])
    -> [c] (or [c k]): (c - mean(c) if center) / scale . direction."""
    if center:
        components = components - components.mean(-1, keepdim=True)
    return (components / scale) @ direction


def output_bias(attn: Any, W_O: torch.Tensor) -> torch.Tensor:
    """An attention layer's output bias b_O [d_model], float on W_O's device; zeros where it has
    none (Llama-family models): a missing bias adds nothing to the residual."""
    b_O = getattr(attn, "b_O", None)
    return W_O.new_zeros(W_O.shape[-1]) if b_O is None else b_O.detach().to(W_O)


def final_norm_affine(model: Any) -> tuple[torch.Tensor | None, torch.Tensor | None, bool]:
    """(gamma, beta, centers) of the model's final norm: ours (`gamma`, `beta`), TransformerLens
    (`w`, `b`) or a bridge (`weight`, `bias`); (None, None, False) without a final norm."""
    norm_type = getattr(model.cfg, "normalization_type", None)
    ln = getattr(model, "ln_final", None)
    if ln is None or norm_type is None:
        return None, None, False
    if getattr(model.cfg, "final_rms", False) or norm_type in ("RMS", "RMSPre"):
        centers = False
    elif norm_type in ("LN", "LNPre"):
        centers = True
    else:
        raise ProbeInputError(f"cannot attribute through a final norm of type {norm_type!r}")

    def first(*names: str) -> torch.Tensor | None:
        for n in names:
            value = getattr(ln, n, None)
            if isinstance(value, torch.Tensor):
                return value.detach()
        return None
    return first("gamma", "w", "weight"), first("beta", "b", "bias"), centers


def check_decomposable(model: Any) -> None:
    """Refuse models whose final residual is not the sum of the components."""
    if not has_lens_cfg(model):  # nanochat's GPT, a tutorial's: nothing to read the components at
        raise ProbeInputError(f"{type(model).__name__} has no hook points on its heads and MLPs (ours and a "
                              "TransformerBridge's have them): direct logit attribution cannot decompose it")
    cfg = model.cfg
    HookedSource(model)  # its one check: attention layers at hook points
    if getattr(cfg, "residual", True) is False:
        raise ProbeInputError("this model has no residual connections, so its output is not a sum of "
                              "head and MLP outputs: direct logit attribution needs a residual stream")
    if getattr(cfg, "norm", "none") != "none" and getattr(cfg, "norm_placement", "pre") == "post":
        raise ProbeInputError("this model normalises after each sublayer (norm_placement='post'): its "
                              "residual is not a sum of head and MLP outputs")
    needed = ["hook_embed", "blocks.0.attn.hook_z", "blocks.0.hook_mlp_out"]
    missing = [n for n in needed if n not in hook_names(model)]
    if missing:
        raise ProbeInputError(f"{type(model).__name__} has no hook point {missing[0]}")


# ---------------------------------------------------------------- the runner

@dataclass
class AttributionResult:
    labels: list[str]  # one per row: embed, pos_embed, L0H0.., L0 MLP.., attn_bias, final_bias
    values: list[float]  # per row, to the target's logit (or the logit difference with versus)
    heads: list[list[float]]  # [layer][head], the head rows again as a grid
    mlps: list[float]  # [layer]
    logit: float  # the model's logit (difference) at the position
    total: float  # sum of the rows
    position: int
    target: dict[str, Any]  # {"id", "piece", "source": "next" | "top" | "given"}
    versus: dict[str, Any] | None
    tokens: list[int]
    pieces: list[str | None]
    source: str | None = None  # where the CLI took the window from when given no --text

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(dict(self.__dict__))

    def format(self, top: int = 10) -> str:
        what = f"logit of {self.target['piece']!r} (id {self.target['id']}, {self.target['source']})"
        if self.versus is not None:
            what += f" minus {self.versus['piece']!r} (id {self.versus['id']})"
        shown = "".join(p if p is not None else "?" for p in self.pieces)
        lines = [f"direct logit attribution at position {self.position} of {shown!r}"
                 + (f" ({self.source})" if self.source else ""), what,
                 f"model: {self.logit:.4f}   sum of the rows: {self.total:.4f}",
                 f"largest {min(top, len(self.values))} of {len(self.values)} rows:"]
        order = sorted(range(len(self.values)), key=lambda i: -abs(self.values[i]))[:top]
        lines += [f"  {self.labels[i]:<12}{self.values[i]:>10.4f}" for i in order]
        lines.append("heads (layer x head):")
        lines += [f"  L{l:<3}" + "".join(f"{v:>9.3f}" for v in row) for l, row in enumerate(self.heads)]
        lines.append("MLPs: " + " ".join(f"L{l} {v:.3f}" for l, v in enumerate(self.mlps)))
        return "\n".join(lines)


def run(model: Any, tokens: torch.Tensor | str, *, position: int = -1, target: int | str | None = None,
        versus: int | str | None = None, tokenizer: Any = None) -> AttributionResult:
    """Direct logit attribution of `model` (ours or a TransformerBridge) on one window.

    `tokens`: [1 pos] ids (pos <= n_ctx) or text. `target` / `versus`: an id or a vocabulary
    piece; `target` defaults to the true next token, or at the last position to the model's top
    prediction there. One forward pass with hooks reading only the chosen position.
    """
    check_decomposable(model)
    tokenizer = model_tokenizer(model, tokenizer)
    cfg = model.cfg
    n_ctx, d_vocab = int(cfg.n_ctx), int(cfg.d_vocab)
    if isinstance(tokens, str):
        tokens = tokens_or_text(model, tokens, tokenizer, n_ctx=10**9)[0]
    (window,) = as_batches(tokens, 10**9, d_vocab)[:1]
    window = window[:1]  # [1 pos]
    n = window.shape[1]
    if n > n_ctx:
        raise ProbeInputError(f"the input is {n} tokens, more than the model's context of {n_ctx}")
    if not -n <= position < n:
        raise ProbeInputError(f"position {position} is beyond the input's {n} tokens "
                              f"(use 0..{n - 1}, or -{n}..-1 from the end)")
    pos = position % n
    target_id = None if target is None else resolve_token(target, tokenizer, d_vocab)
    versus_id = None if versus is None else resolve_token(versus, tokenizer, d_vocab)

    kept: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(x: torch.Tensor, hook: Any) -> None:  # [batch pos ...]
            kept[name] = x[0, pos].detach().float()
        return hook

    L = int(cfg.n_layers)
    names = ["hook_embed"] + [f"blocks.{l}.attn.hook_z" for l in range(L)] + \
            [f"blocks.{l}.hook_mlp_out" for l in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    available = hook_names(model)
    names += [n for n in ("hook_pos_embed", "ln_final.hook_scale") if n in available]
    with eval_mode(model), torch.no_grad():
        logits = model.run_with_hooks(window.to(model_device(model)),
                                      fwd_hooks=[(n, keep(n)) for n in names])[0, pos].float()  # [d_vocab]
        W_O = torch.stack([block.attn.W_O for block in model.blocks]).float()  # [layer head d_head d_model]
        b_O = torch.stack([output_bias(block.attn, W_O) for block in model.blocks])  # [layer d_model]
        W_U = model.W_U.detach().float()  # [d_model d_vocab]
        b_U = getattr(model, "b_U", None)
        b_U = None if b_U is None else b_U.detach().float()  # [d_vocab]

    source = "given"
    if target_id is None:
        source = "next" if pos + 1 < n else "top"
        target_id = int(window[0, pos + 1]) if pos + 1 < n else int(logits.argmax())
    heads = torch.stack([head_outputs(kept[f"blocks.{l}.attn.hook_z"], W_O[l]) for l in range(L)])  # [layer head d_model]
    rows = [kept["hook_embed"].unsqueeze(0)]  # each [k d_model]
    labels = ["embed"]
    if "hook_pos_embed" in kept:
        rows.append(kept["hook_pos_embed"].unsqueeze(0))
        labels.append("pos_embed")
    rows += [heads.flatten(0, 1), torch.stack([kept[f"blocks.{l}.hook_mlp_out"] for l in range(L)]),
             b_O.sum(0, keepdim=True)]
    labels += [f"L{l}H{h}" for l in range(L) for h in range(heads.shape[1])] + \
              [f"L{l} MLP" for l in range(L)] + ["attn_bias"]
    components = torch.cat(rows)  # [rows d_model]
    resid = kept[f"blocks.{L - 1}.hook_resid_post"]  # [d_model]
    resid_error = float((components.sum(0) - resid).abs().max()) / max(1.0, float(resid.abs().max()))

    gamma, beta, centers = final_norm_affine(model)
    scale = kept["ln_final.hook_scale"] if gamma is not None or centers else 1.0  # [1]
    direction = W_U[:, target_id] if versus_id is None else W_U[:, target_id] - W_U[:, versus_id]  # [d_model]
    values = direct_attributions(components, scale, direction * (1.0 if gamma is None else gamma.float()), centers)
    final_bias = (0.0 if beta is None else float(beta.float() @ direction))
    if b_U is not None:
        final_bias += float(b_U[target_id] - (0.0 if versus_id is None else b_U[versus_id]))
    values = torch.cat([values, torch.tensor([final_bias])])  # [rows + 1]
    labels.append("final_bias")
    logit = float(logits[target_id] - (0.0 if versus_id is None else logits[versus_id]))
    total = float(values.double().sum())
    if abs(total - logit) > SUM_TOLERANCE * max(1.0, abs(logit)) or resid_error > SUM_TOLERANCE:
        log.warning("the attributions sum to %.6g but the model's logit is %.6g (residual off by %.3g of its size): "
                    "this model's residual is not the sum of its components", total, logit, resid_error)
    start = labels.index("L0H0")
    n_heads = heads.shape[1]
    head_grid = values[start:start + L * n_heads].view(L, n_heads)  # [layer head]
    ids = window[0].tolist()
    return AttributionResult(
        labels=labels, values=values.tolist(), heads=head_grid.tolist(),
        mlps=values[start + L * n_heads:start + L * n_heads + L].tolist(), logit=logit, total=total,
        position=pos, target={"id": target_id, "piece": token_piece(tokenizer, target_id), "source": source},
        versus=None if versus_id is None else {"id": versus_id, "piece": token_piece(tokenizer, versus_id)},
        tokens=ids, pieces=[token_piece(tokenizer, i) for i in ids])


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> Shown:
    from models.checkpoint import load_from_args
    snap = load_from_args(args)
    check_decomposable(snap.model)  # an MLP-family model is refused before the text is read
    if snap.tokenizer is None:
        no_tokenizer(snap)
    text, source = args.text, None
    if text is None:  # one window of the run's own text (probes.run_text)
        text, source = default_windows(snap, snap.tokenizer, int(snap.model.cfg.n_ctx), 1, 0)
    result = run(snap.model, text, position=args.position, target=args.target,
                 versus=args.versus, tokenizer=snap.tokenizer)
    result.source = source
    return Shown.of(result, lambda: result.format(args.top))


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
