"""Head types: previous-token, duplicate-token, induction and sink scores per layer and head.

    from probes import heads
    result = heads.run(model, tokens)                     # ours, a bridge, or any nn.Module (the tap)
    result = heads.run_repeat(model, length=32, seed=0)   # random tokens repeated twice
    result.scores["induction"][layer][head]               # in [0, 1]
    result.to_dict()                                      # == python -m probes.heads ... --json

Definitions: TransformerLens's `head_detector.detect_head` with its built-in head names, scored
the same way. For one sequence of tokens t_0..t_{n-1}, a detection pattern D [q k] (lower
triangular, 0/1) says where the head type attends:
- `previous_token`: D[i, i-1] = 1;
- `duplicate_token`: D[i, j] = 1 for j < i with t_j == t_i;
- `induction`: D[i, j] = 1 for 1 <= j <= i with t_{j-1} == t_i (the token after an earlier copy);
- `sink` (ours, not a TransformerLens name): D[i, 0] = 1 for every row, the first position.
The "mul" score (detect_head's default) is sum(P * D) / sum(P) over the head's pattern P [q k]:
the fraction of the head's attention that falls where D says (rows sum to 1, so sum(P) = n).
`exclude_bos` zeroes P's first column and `exclude_current_token` its diagonal before both sums;
the "abs" score is 1 - round(sum|P - D| / n, 3), the exclusions zeroing those entries of |P - D|.
As detect_head on a list of prompts, the score of many windows is the mean of each window's.

The induction score of Olsson et al. (2022), `induction_repeat`: on random tokens repeated
(period L), the mean over every query i >= L of P[i, i - L + 1], the attention from a token of a
later copy to the token after its earlier occurrence (their "prefix matching" score).
`copying` (Elhage et al. 2021): sum(Re lambda) / sum(|lambda|) over the eigenvalues of the head's
full OV circuit W_E W_V W_O W_U (norms left out), 1 when it copies what it attends to onto the
logits, -1 when it suppresses it. From the weights alone; None where they cannot be read.

`previous_token_rows` and `first_position_rows` (`probes.rows.head_types`) are also what
`probes.degenerate`'s "previous" and "sink" evidence is made of (through `probes.rows.stats` and
`probes.rows.qk`).
"""

from __future__ import annotations

if __name__ == "__main__":  # --help and bad arguments answered before torch is imported (~4 s)
    from probes.args import heads_parser
    heads_parser().parse_early()

import logging
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from probes.args import heads_parser as build_parser
from probes.cli import run_probe
from probes.common import (ProbeInputError, per_query_head, progress_bar, random_repeat_tokens, text_ids,
                           to_jsonable, token_batches)
from probes.rows.head_types import first_position_rows, previous_token_rows  # noqa: F401  (re-exported)
from probes.sources import snapshot_source, source_of

log = logging.getLogger(__name__)

HEAD_TYPES = ("previous_token", "duplicate_token", "induction", "sink")
ERROR_MEASURES = ("mul", "abs")


# ---------------------------------------------------------------- pure functions on patterns

def duplicate_token_detection(tokens: torch.Tensor) -> torch.Tensor:
    """detect_head's duplicate-token pattern: [batch pos] -> [batch q k] (j < i, t_j == t_i)."""
    n = tokens.shape[-1]
    same = tokens.unsqueeze(-1) == tokens.unsqueeze(-2)  # [batch q k]
    below = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril(-1)
    return (same & below).float()


def induction_detection(tokens: torch.Tensor) -> torch.Tensor:
    """detect_head's induction pattern: [batch pos] -> [batch q k] (1 <= j <= i, t_{j-1} == t_i):
    the duplicate pattern shifted one key to the right, first column 0, lower triangle kept."""
    dup = duplicate_token_detection(tokens)  # [batch q k]
    out = torch.zeros_like(dup)
    out[..., 1:] = dup[..., :-1]
    return out.tril()


def fixed_detection(name: str, n: int, device: Any = None) -> torch.Tensor:
    """The token-independent patterns [q k]: previous_token (sub-diagonal) or sink (first column)."""
    if name == "previous_token":
        return torch.ones(n - 1, device=device).diag(-1)
    if name == "sink":
        return torch.zeros(n, n, device=device).index_fill_(1, torch.tensor([0], device=device), 1.0)
    raise ValueError(f"{name!r} depends on the tokens or is unknown; fixed ones: previous_token, sink")


def detection_patterns(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every head type's detection pattern for [batch pos] tokens: name -> [batch q k]."""
    batch, n = tokens.shape
    out = {name: fixed_detection(name, n, tokens.device).expand(batch, n, n)
           for name in ("previous_token", "sink")}
    out["duplicate_token"] = duplicate_token_detection(tokens)
    out["induction"] = induction_detection(tokens)
    return {name: out[name] for name in HEAD_TYPES}


def _excluded(pattern: torch.Tensor, exclude_bos: bool, exclude_current_token: bool) -> torch.Tensor:
    if not (exclude_bos or exclude_current_token):
        return pattern
    pattern = pattern.clone()  # never write into the model's (or a cache's) pattern
    if exclude_bos:
        pattern[..., 0] = 0
    if exclude_current_token:
        pattern.diagonal(dim1=-2, dim2=-1).zero_()
    return pattern


def mul_score(pattern: torch.Tensor, detection: torch.Tensor, *, exclude_bos: bool = False,
              exclude_current_token: bool = False) -> torch.Tensor:
    """detect_head's "mul" score per window and head: pattern [batch head q k], detection
    [batch q k] or [q k] -> [batch head], sum(P * D) / sum(P) after the exclusions."""
    p = _excluded(pattern, exclude_bos, exclude_current_token)
    if detection.dim() == 2:
        hit = torch.einsum("bhqk,qk->bh", p, detection.to(p.dtype))
    else:
        hit = torch.einsum("bhqk,bqk->bh", p, detection.to(p.dtype))
    return hit / p.sum(dim=(-2, -1))


def abs_score(pattern: torch.Tensor, detection: torch.Tensor, *, exclude_bos: bool = False,
              exclude_current_token: bool = False) -> torch.Tensor:
    """detect_head's "abs" score: [batch head q k], [batch q k] or [q k] -> [batch head],
    1 - round(sum|P - D| / n, 3) with the excluded entries of |P - D| zeroed."""
    n = pattern.shape[-1]
    det = detection if detection.dim() == 2 else detection.unsqueeze(1)  # [q k] or [batch 1 q k]
    diff = _excluded((pattern - det.to(pattern.dtype)).abs(), exclude_bos, exclude_current_token)
    return 1 - torch.round(diff.sum(dim=(-2, -1)) / n, decimals=3)


def repeat_induction_score(pattern: torch.Tensor, period: int) -> torch.Tensor:
    """Olsson et al.'s induction score on tokens repeated with `period` L: the mean of P[i, i-L+1]
    over queries i >= L. [batch head q k] -> [batch head]."""
    n = pattern.shape[-1]
    if not 1 <= period < n:
        raise ProbeInputError(f"a repeat period of {period} leaves no repeated token in {n} positions")
    return pattern.diagonal(offset=1 - period, dim1=-2, dim2=-1)[..., 1:].mean(-1)


def copying_scores(W_E: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor, W_U: torch.Tensor) -> torch.Tensor:
    """sum(Re lambda) / sum(|lambda|) of each head's full OV circuit W_E W_V W_O W_U.

    W_E [vocab d_model], W_V [layer head d_model d_head], W_O [layer head d_head d_model],
    W_U [d_model vocab] -> [layer head]. The nonzero eigenvalues of (W_E W_V)(W_O W_U) are those
    of (W_O W_U)(W_E W_V) [d_head d_head], so no [vocab vocab] matrix is formed."""
    left = torch.einsum("vm,lhmd->lhvd", W_E.double(), W_V.double())  # [layer head vocab d_head]
    right = torch.einsum("lhdm,mv->lhdv", W_O.double(), W_U.double())  # [layer head d_head vocab]
    eig = torch.linalg.eigvals(right @ left)  # [layer head d_head]
    return eig.real.sum(-1) / eig.abs().sum(-1).clamp_min(1e-30)


# ---------------------------------------------------------------- the runner

@dataclass
class HeadTypesResult:
    model: str
    scores: dict[str, list[list[float]]]  # head type -> [layer][head]
    error_measure: str
    exclude_bos: bool
    exclude_current_token: bool
    tokens: int
    windows: int
    induction_repeat: list[list[float]] | None = None  # [layer][head], Olsson et al.
    copying: list[list[float]] | None = None  # [layer][head], OV eigenvalue score
    repeat_length: int | None = None
    source: str | None = None
    confirmed: list[dict[str, Any]] | None = None  # --confirm: induction heads ablated (probes.development_parts.phase_ablation)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(dict(self.__dict__))

    def format(self) -> str:
        from probes.entropy import format_table
        layers = list(range(len(next(iter(self.scores.values())))))
        heads = list(range(len(self.scores["sink"][0])))
        lines = [f"model: {self.model}", f"measured on {self.tokens} tokens in {self.windows} window(s)"
                 + (f" ({self.source})" if self.source else ""),
                 f"scores ('{self.error_measure}' as transformer_lens detect_head; exclude_bos="
                 f"{self.exclude_bos}, exclude_current_token={self.exclude_current_token}):"]
        grids = dict(self.scores)
        if self.induction_repeat is not None:
            grids[f"induction_repeat (Olsson et al., period {self.repeat_length})"] = self.induction_repeat
        if self.copying is not None:
            grids["copying (OV circuit eigenvalues, -1..1)"] = self.copying
        for name, grid in grids.items():
            lines += [f"{name}:", format_table(layers, heads, grid)]
        if self.confirmed is not None:
            lines.append("induction heads ablated alone (the repeat's second-half loss without each):"
                         if self.confirmed else "no head scores as an induction head: none to ablate")
            lines += [f"  L{c['head'][0]}H{c['head'][1]} score {c['induction_repeat']:.2f}: loss {c['loss_rise']:+.3f} "
                      + ("(confirmed)" if c["confirmed"] else "(not confirmed: removing it changes little)")
                      for c in self.confirmed]
        return "\n".join(lines)


def run(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor] | str, *, error_measure: str = "mul",
        exclude_bos: bool = False, exclude_current_token: bool = False, repeat_period: int | None = None,
        copying: bool = True, batch_size: int = 16, progress: bool | None = None,
        name: str | None = None, source: str | None = None, tokenizer: Any = None) -> HeadTypesResult:
    """Head-type scores of every layer and head of `model` (ours, a TransformerBridge, any module
    mapping [batch pos] ids to logits, read through the attention tap, or an attention source).

    `tokens`: [batch pos] ids, a list of such batches, or text (read as `--text` is); long rows
    are windowed to the context. `repeat_period`: the tokens repeat with this period (e.g. from
    `random_repeat_tokens`), so Olsson et al.'s induction score is measured too. Each layer's
    pattern is reduced inside its hook to [batch head] scores and dropped.
    """
    if error_measure not in ERROR_MEASURES:
        raise ProbeInputError(f"error_measure must be one of {ERROR_MEASURES}, got {error_measure!r}")
    tokens = text_ids(model, tokens, tokenizer)
    attn = source_of(model, tokens)
    dims = attn.dims
    batches = attn.batches(tokens, batch_size)
    score = mul_score if error_measure == "mul" else abs_score
    sums = torch.zeros(len(HEAD_TYPES), dims.n_layers, dims.n_heads, dtype=torch.float64)
    repeat_sum = torch.zeros(dims.n_layers, dims.n_heads, dtype=torch.float64)
    windows = n_tokens = 0
    with attn.reading():
        for batch in progress_bar(batches, progress, "head types"):
            batch = batch.to(attn.device)
            if repeat_period is not None and batch.shape[1] <= repeat_period:
                raise ProbeInputError(f"windows of {batch.shape[1]} tokens hold no repeat of period {repeat_period}")
            detections = detection_patterns(batch)  # name -> [batch q k]

            def reduce(layer: int, pattern: torch.Tensor) -> None:  # [batch head q k]
                p = pattern.detach().float()
                for t, det in enumerate(detections.values()):
                    sums[t, layer] += score(p, det, exclude_bos=exclude_bos,
                                            exclude_current_token=exclude_current_token).sum(0).double().cpu()
                if repeat_period is not None:
                    repeat_sum[layer] += repeat_induction_score(p, repeat_period).sum(0).double().cpu()

            # the pass ends once the last layer is reduced: the unembedding is not needed
            attn.each_layer_pattern(batch, range(dims.n_layers), reduce)
            windows += batch.shape[0]
            n_tokens += batch.numel()
    grids = {name_: (sums[t] / windows).tolist() for t, name_ in enumerate(HEAD_TYPES)}
    return HeadTypesResult(
        model=name or attn.describe(), scores=grids, error_measure=error_measure,
        exclude_bos=exclude_bos, exclude_current_token=exclude_current_token, tokens=n_tokens,
        windows=windows, induction_repeat=(repeat_sum / windows).tolist() if repeat_period else None,
        copying=model_copying_scores(attn.model) if copying and attn.model is not None else None,
        repeat_length=repeat_period, source=source)


def run_repeat(model: Any, length: int | None = None, *, samples: int = 16, seed: int = 0,
               **options: Any) -> HeadTypesResult:
    """`run` on `samples` random sequences of `length` tokens from the model's vocabulary, each
    repeated twice (length defaults to half the context), with the Olsson et al. score."""
    attn = source_of(model)
    dims = attn.dims
    if attn.fixed_repeat is not None:  # a saved snapshot's own repeat: its length and samples
        tokens, saved = attn.fixed_repeat
        if length not in (None, saved):
            raise ProbeInputError(f"--length {length}: the snapshot saved a repeat of length {saved} only")
        length, samples, seed = saved, tokens.shape[0], 0
    length = dims.n_ctx // 2 if length is None else length
    if 2 * length > dims.n_ctx:
        raise ProbeInputError(f"--length {length} repeated twice is {2 * length} tokens, more than "
                              f"the model's context of {dims.n_ctx}; use at most {dims.n_ctx // 2}")
    if attn.fixed_repeat is None:
        tokens = random_repeat_tokens(dims.d_vocab, length, samples, seed)  # [samples 2*length]
    options.setdefault("source", f"{samples} random sequence(s) of {length} tokens repeated twice, seed {seed}")
    return run(attn, tokens, repeat_period=length, **options)


def model_copying_scores(model: Any) -> list[list[float]] | None:
    """`copying_scores` from the model's W_E, W_V, W_O, W_U (ours and TransformerLens names)."""
    try:
        with torch.no_grad():
            W_O = torch.stack([block.attn.W_O for block in model.blocks])  # [layer head d_head d_model]
            W_V = torch.stack([per_query_head(block.attn.W_V, W_O.shape[1])
                               for block in model.blocks])  # [layer head d_model d_head]
            return copying_scores(model.W_E, W_V, W_O, model.W_U).tolist()
    except (AttributeError, RuntimeError, ValueError, TypeError) as err:
        log.debug("no copying score: %s", err)
        return None


# ---------------------------------------------------------------- CLI

def confirmed(snap: Any, result: HeadTypesResult, samples: int, seed: int) -> list[dict[str, Any]]:
    """--confirm: the heads scoring as induction heads on the repeat, each ablated alone on that repeat."""
    from probes.development_parts.phase_ablation import confirm_induction

    length = result.repeat_length
    tokens = random_repeat_tokens(snap.config.d_vocab, length, samples, seed)  # the repeat run_repeat read
    return confirm_induction(snap.model, (tokens, length), result.induction_repeat)


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> HeadTypesResult:
    from models.checkpoint import load_from_args
    snap = load_from_args(args)
    attn = snapshot_source(snap)
    options = dict(error_measure=args.error_measure, exclude_bos=args.exclude_bos,
                   exclude_current_token=args.exclude_current_token, batch_size=args.batch_size,
                   progress=args.progress, name=str(snap.name))
    if args.repeat:
        result = run_repeat(attn, args.length, samples=args.samples or 16, seed=args.seed, **options)
        if args.confirm:
            result.confirmed = confirmed(snap, result, args.samples or 16, args.seed)
        return result
    batches, source = token_batches(args, snap.tokenizer, attn.dims.n_ctx, snap)
    return run(attn, batches, source=source, **options)


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
