"""Head ablation: the model's next-token loss with heads' outputs (their z) set to zero or to
their mean, each head alone and all of them together.

    from probes import ablate
    result = ablate.run(model, tokens, heads=[(1, 0), (1, 2)], how="mean")
    result.loss, result.each[(1, 0)], result.together, result.per_token  # [batch pos-1]

Definition: the mean cross-entropy of each next token (position i predicts token i+1) over the
batch. `how="zero"` sets the head's z [batch pos d_head] to 0; `how="mean"` to its mean over the
batch and positions of the unablated run on these tokens (so later heads are ablated to the means
they had with nothing ablated). All runs (none ablated, each head, all together) go as rows of one
batch.
"""

from __future__ import annotations

if __name__ == "__main__":  # --help and bad arguments answered before torch is imported
    from probes.patching_args import ablate_parser
    ablate_parser().parse_early()

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from probes.cli import run_probe
from probes.common import ProbeInputError, eval_mode, model_device, model_tokenizer, text_ids
from probes.patching.engines import editing_engine
from probes.patching_args import ablate_parser as build_parser

HOWS = ("zero", "mean")


@dataclass
class Ablation:
    how: str
    heads: list[tuple[int, int]]
    loss: float  # none ablated
    each: dict[tuple[int, int], float]  # each head ablated alone
    together: float  # all of them at once
    per_token: torch.Tensor  # [batch pos-1]: loss with all ablated minus without, per predicted token
    tokens: list[list[int]] = field(default_factory=list)
    source: str | None = None  # what the CLI measured on, in words

    def to_dict(self) -> dict[str, Any]:
        from models.cli import to_jsonable
        return to_jsonable({"how": self.how, "heads": [list(h) for h in self.heads], "loss": self.loss,
                            "each": [{"head": list(h), "loss": v, "change": v - self.loss}
                                     for h, v in self.each.items()],
                            "together": self.together, "per_token": self.per_token, "tokens": self.tokens,
                            "source": self.source})

    def format(self) -> str:
        lines = [f"on {self.source}"] if self.source else []
        lines += [f"{self.how} ablation: loss {self.loss:.4f} with nothing ablated, {self.together:.4f} "
                 f"({self.together - self.loss:+.4f}) with all {len(self.heads)} together", "each head alone:"]
        lines += [f"  L{l}H{h}   {v:.4f} ({v - self.loss:+.4f})" for (l, h), v in self.each.items()]
        return "\n".join(lines)


def token_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: logits [rows pos vocab], tokens [rows pos] -> [rows pos-1]."""
    return F.cross_entropy(logits[:, :-1].float().transpose(1, 2), tokens[:, 1:], reduction="none")


def check_heads(heads: Any, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    out = []
    for item in heads:
        try:
            layer, head = (int(v) for v in item)
        except (TypeError, ValueError):
            raise ProbeInputError(f"a head is (layer, head), got {item!r}") from None
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ProbeInputError(f"head ({layer}, {head}) is outside this model's {n_layers} layers x {n_heads} heads")
        out.append((layer, head))
    if not out:
        raise ProbeInputError("no heads to ablate: give at least one (layer, head)")
    return list(dict.fromkeys(out))


def run(model: Any, tokens: Any, heads: Any, how: str = "zero", tokenizer: Any = None) -> Ablation:
    """Ablate `heads` [(layer, head), ...] of `model` on tokens [batch pos] (or a text)."""
    if how not in HOWS:
        raise ProbeInputError(f"how must be one of {', '.join(HOWS)}, got {how!r}")
    ids = (text_ids(model, tokens, model_tokenizer(model, tokenizer)) if isinstance(tokens, str)
           else torch.as_tensor(tokens))
    ids = (ids.unsqueeze(0) if ids.dim() == 1 else ids).long().to(model_device(model))  # [batch pos]
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ProbeInputError(f"ablation needs tokens [batch pos] with at least 2 positions, got {tuple(ids.shape)}")
    from probes.patching.engines import model_dims
    n_layers, n_heads, _ = model_dims(model, ids)
    heads = check_heads(heads, n_layers, n_heads)
    engine = editing_engine(model, "heads", n_layers, ids)
    batch, groups = ids.shape[0], len(heads) + 2  # rows: none, each head, all together
    with eval_mode(model), torch.no_grad():
        layers = {l for l, _ in heads}
        means = {l: a.float().mean(dim=(0, 1)).to(a.dtype) for l, a in engine.trace(ids).acts.items()} \
            if how == "mean" else {}  # {layer: [head d_head]}

        def edit(layer: int):
            def apply(z: torch.Tensor) -> torch.Tensor:  # [groups*batch pos head d_head]
                z = z.clone()
                runs = z.unflatten(0, (groups, batch))
                for g, (l, h) in enumerate(heads):
                    if l == layer:
                        for target in (runs[g + 1], runs[-1]):
                            target[:, :, h] = means[l][h] if how == "mean" else 0.0
                return z
            return apply
        logits = engine.run(ids.repeat(groups, 1), {l: edit(l) for l in layers})
        losses = token_losses(logits, ids.repeat(groups, 1)).unflatten(0, (groups, batch))  # [groups batch pos-1]
    means_per_run = losses.mean(dim=(1, 2)).tolist()
    return Ablation(how=how, heads=heads, loss=means_per_run[0],
                    each={h: means_per_run[i + 1] for i, h in enumerate(heads)}, together=means_per_run[-1],
                    per_token=(losses[-1] - losses[0]).cpu(), tokens=ids.tolist())


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> Ablation:
    from models.tap_inputs import context_of
    from probes.common import default_windows, no_tokenizer, random_repeat_tokens
    from probes.patching.cli import runnable
    from probes.patching.engines import model_dims
    snap = runnable(args)
    model = snap.model
    _, _, d_vocab = model_dims(model, torch.zeros(1, 2, dtype=torch.long, device=model_device(model)))
    cfg = getattr(model, "cfg", None)
    n_ctx = int(cfg.n_ctx) if cfg is not None else (context_of(model) or 256)
    if args.repeat:
        length = args.length or n_ctx // 2
        if 2 * length > n_ctx:
            raise ProbeInputError(f"--length {length} repeated twice is more than the model's context of {n_ctx}")
        tokens = random_repeat_tokens(d_vocab, length, batch=args.samples, seed=args.seed)
        source = f"{args.samples} sequences of {length} random tokens repeated twice (seed {args.seed})"
    elif args.text is not None:
        if snap.tokenizer is None:
            no_tokenizer(snap)
        tokens, source = text_ids(model, args.text, snap.tokenizer)[:, :n_ctx], "the given text"
    else:
        tokens, source = default_windows(snap, snap.tokenizer, n_ctx, args.samples, args.seed)
    result = run(model, tokens, heads=args.heads, how=args.how)
    result.source = source
    return result


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
