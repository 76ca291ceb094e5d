"""`run`: activation patching (exact or attribution) of one clean / corrupt pair on a model."""

from __future__ import annotations

import logging
from typing import Any

import torch

from probes.common import ProbeInputError, encode_text, eval_mode, model_device, model_tokenizer, text_ids
from probes.patching.cells import DIRECTIONS, WHATS, Sweep, first_position
from probes.patching.metric import make_metric, score
from probes.patching.result import Patching

log = logging.getLogger(__name__)

METHODS = ("exact", "attribution")
BUDGET = 256 * 2**20  # bytes of activations one batch of patched runs may hold


def run(model: Any, clean: Any, corrupt: Any, metric: Any = None, answer: Any = None, wrong: Any = None,
        what: str = "heads", by_position: bool = True, method: str = "exact", direction: str = "denoise",
        batch: int | None = None, atp_star: bool = False, tokenizer: Any = None) -> Patching:
    """Activation patching of `model` between a clean and a corrupt input.

    clean, corrupt: token ids [batch pos] of one shape, or texts (encoded with the model's
    tokenizer) of the same token length. Score each run by either `metric`, a callable on one
    run's logits [batch pos vocab] returning a scalar (as TransformerLens's patching_metric), or
    `answer` (with `wrong`: the logit difference answer - wrong at the last position, averaged
    over the batch; alone: the answer's log-probability there), each an id or a one-token text.
    what: "heads" (each head's z), "resid" (resid_pre), "attn" / "mlp" (each block's output);
    by_position: one patch per position, or all positions at once. direction: "denoise" (the
    corrupt run with one clean activation) or "noise" (the clean run with one corrupt one).
    method: "exact" (patched runs as rows of batches of `batch` patches, by default as many as a
    256 MiB budget holds) or "attribution" (every patch estimated from 2 forwards and 1 backward;
    `atp_star` recomputes the attention softmax exactly where a patch moves queries or keys).
    """
    check_options(what, method, direction, batch)
    tokenizer = model_tokenizer(model, tokenizer)
    clean_ids, corrupt_ids = pair_ids(model, clean, corrupt, tokenizer)
    from probes.patching.engines import model_dims, traced_engine
    n_layers, n_heads, d_vocab = model_dims(model, corrupt_ids.to(model_device(model)))
    metric_fn = make_metric(metric, answer, wrong, d_vocab, lambda t: one_token(t, tokenizer, d_vocab))
    n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", None)
    if n_ctx is not None and clean_ids.shape[1] > int(n_ctx):
        raise ProbeInputError(f"the inputs are {clean_ids.shape[1]} tokens, more than the model's context of {n_ctx}")
    sweep = Sweep(what, by_position, n_layers, clean_ids.shape[1], n_heads)
    device = model_device(model)
    clean_ids, corrupt_ids = clean_ids.to(device), corrupt_ids.to(device)
    base_ids, donor_ids = (corrupt_ids, clean_ids) if direction == "denoise" else (clean_ids, corrupt_ids)
    with eval_mode(model):
        if method == "attribution":
            from probes.patching.attribution import attribute
            values, clean_value, corrupt_value, forwards = attribute(model, sweep, metric_fn, clean_ids, corrupt_ids,
                                                                     direction, atp_star)
            engine = base = donor = None
        else:
            with torch.no_grad():
                engine, base, donor = traced_engine(model, what, n_layers, base_ids, donor_ids)
                values, forwards = exact(engine, sweep, base, donor, metric_fn, batch)
            base_value, donor_value = (float(score(metric_fn, t.logits, 1)) for t in (base, donor))
            clean_value, corrupt_value = ((donor_value, base_value) if direction == "denoise"
                                          else (base_value, donor_value))
            forwards += 2  # the two traced runs

    def rerun(index: tuple[int, ...]) -> torch.Tensor:
        layer, pos, head = sweep.cell_of(index)
        with eval_mode(model), torch.no_grad():
            eng, b, d = (engine, base, donor) if engine is not None else traced_engine(
                model, what, n_layers, base_ids, donor_ids)
            return eng.patched(b, d, what, layer, [(pos, head)], 0, False)

    return Patching(what=what, by_position=by_position, method=method, direction=direction, metric=metric_fn.name,
                    clean=clean_value, corrupt=corrupt_value, patched=values, forwards=forwards, axes=sweep.axes,
                    clean_tokens=clean_ids.tolist(), corrupt_tokens=corrupt_ids.tolist(),
                    pieces=pieces(tokenizer, corrupt_ids[0].tolist()), atp_star=atp_star and method == "attribution",
                    _rerun=rerun, _tokenizer=tokenizer)


def exact(engine: Any, sweep: Sweep, base: Any, donor: Any, metric: Any, batch: int | None) -> tuple[torch.Tensor, int]:
    """Every cell's patched metric [sweep.shape] and the number of batched forwards it took."""
    size = batch or max(1, BUDGET // patch_rows_bytes(base, sweep, metric.last_only))
    out = torch.empty(sweep.n_layers, len(sweep.cells()))
    forwards = 0
    for layer in range(sweep.n_layers):
        cells = sweep.cells()
        unreached = cannot_reach_last(engine, sweep, metric, layer)
        if unreached:
            out[layer, :unreached] = float(score(metric, base.logits, 1))
        for i, chunk in chunks(cells, unreached, size, sweep.n_pos if engine.suffix else 0):
            start = first_position(chunk) if engine.suffix else 0
            logits = engine.patched(base, donor, sweep.what, layer, chunk, start, metric.last_only)
            out[layer, i:i + len(chunk)] = score(metric, logits, len(chunk)).cpu()
            forwards += 1
    return out.view(sweep.shape), forwards


def cannot_reach_last(engine: Any, sweep: Sweep, metric: Any, layer: int) -> int:
    """How many of the layer's first cells cannot change a metric of the last position: in the last
    block, a head's, attention's or MLP's output at an earlier position reaches no later position
    (no attention after it). Their patched metric is the base run's."""
    if not (engine.suffix and metric.last_only and sweep.by_position and sweep.what != "resid"
            and layer == sweep.n_layers - 1):
        return 0
    return sum(1 for pos, _ in sweep.cells() if pos < sweep.n_pos - 1)


SPANS = 8  # a by-position layer runs in about this many chunks of neighbouring positions at least


def chunks(cells: list, skip: int, size: int, n_pos: int):
    """(index, cells) chunks of at most `size` consecutive cells from `skip` on; with n_pos (an engine
    that runs only positions from a chunk's first on), each spans at most n_pos / SPANS positions,
    so that a chunk of late positions does not run from position 0."""
    span = -(-n_pos // SPANS) if n_pos else 0
    i = skip
    while i < len(cells):
        j = i + 1
        while j < len(cells) and j - i < size and (not span or (cells[j][0] or 0) - (cells[i][0] or 0) < span):
            j += 1
        yield i, cells[i:j]
        i = j


def patch_rows_bytes(base: Any, sweep: Sweep, last_only: bool) -> int:
    """Bytes one patched run holds at once, roughly: a dozen residual-sized tensors, the scores
    [head pos pos] and the logits."""
    logits = base.logits  # [batch pos vocab]
    batch, pos, vocab = logits.shape
    d = base.act("resid", 0).shape[-1] if hasattr(base, "resid") else 1024
    per_row = pos * (16 * d + 2 * sweep.n_heads * pos) + (1 if last_only else pos) * vocab * 2
    return 4 * batch * per_row


def check_options(what: str, method: str, direction: str, batch: int | None) -> None:
    for name, value, choices in (("what", what, WHATS), ("method", method, METHODS),
                                 ("direction", direction, DIRECTIONS)):
        if value not in choices:
            raise ProbeInputError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ProbeInputError(f"batch must be a positive number of patches, got {batch!r}")


def pair_ids(model: Any, clean: Any, corrupt: Any, tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The two inputs as [batch pos] ids of one shape."""
    ids = []
    for name, value in (("clean", clean), ("corrupt", corrupt)):
        if isinstance(value, str) and not value:
            raise ProbeInputError(f"the {name} text is empty")
        t = text_ids(model, value, tokenizer) if isinstance(value, str) else torch.as_tensor(value)
        t = t.unsqueeze(0) if t.dim() == 1 else t
        if t.dim() != 2 or t.dtype.is_floating_point or t.numel() == 0:
            raise ProbeInputError(f"the {name} input must be token ids [batch pos], got {t.dtype} {tuple(t.shape)}")
        ids.append(t.long())
    if ids[0].shape != ids[1].shape:
        raise ProbeInputError(f"the clean and corrupt inputs differ in shape: {tuple(ids[0].shape)} tokens "
                              f"and {tuple(ids[1].shape)}; patching needs the same number of tokens in each")
    return ids[0], ids[1]


def one_token(token: Any, tokenizer: Any, d_vocab: int) -> int:
    """An id, or a text that encodes to exactly one token (or is one vocabulary piece)."""
    from probes.neighbours import resolve_token
    if not isinstance(token, str) or tokenizer is None:
        return resolve_token(token, tokenizer, d_vocab)
    if not token:
        raise ProbeInputError("the answer token is empty")
    ids = encode_text(tokenizer, token)
    if len(ids) == 1:
        return resolve_token(int(ids[0]), None, d_vocab)
    try:
        return resolve_token(token, tokenizer, d_vocab)
    except ProbeInputError:
        raise ProbeInputError(f"{token!r} is {len(ids)} tokens, not one: give a single token "
                              "(the metric reads one token's logit)") from None


def pieces(tokenizer: Any, ids: list[int]) -> list[str | None]:
    from models.tokenizers import token_piece
    return [token_piece(tokenizer, i) for i in ids]
