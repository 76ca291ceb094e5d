"""The Monitor's `save_every` on a model the store cannot rebuild as ours (a GPT a user wrote,
nanochat's, a Hugging Face Llama): a snapshot of any model (`models.store.any_files`), holding,
beside the weights, what the pages and probes read from the model at the step it was saved, so
that they open without the user's code.

    saver = AnySaver(model, eval_tokens, tokenizer, model_args)   # checks what it can once
    saver.save(run_dir / "step_000500", step=500, tokens_seen=...)

The sample: the first rows and positions of the eval tokens, at most `MAX_POSITIONS` positions
and as many rows (up to `MAX_ROWS`) as keep each set of patterns under `PATTERN_BYTES`; the
repeat sample: random tokens repeated twice (`probes.common.random_repeat_tokens`, seed 0), as many
rows and as long as the sample. Read in one no-grad, eval-mode pass each (modes put back), in
float32 without autocast: patterns through the attention tap (`models.tap`), the logit lens
through the model's own final norm and unembedding (`probes.logit_lens` on its anatomy,
`models.anatomy`, found by its names or by its forward, `models.layout`). A 2-layer, 4-head model
saves 0.87 MB of readings at 64 eval positions.

Beside every snapshot, of our models and of any model, the first view (`probes.first_view`: what
the app's model pages show first, read by the same probe calls the pages make) is saved too, so
that the pages draw it before any model loads: for ours on the sidebar's first text
(`write_first_view`, from the model in memory), for any model on row 0 of its saved sample, read
back from the snapshot as the app reads it. A view that cannot be read is logged and left out;
training goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from models.layout import Layout, find_layout
from models.store.foreign import ForeignConfig
from models.tap import TapError, eval_pass, tap_forward
from models.tap_inputs import context_of

log = logging.getLogger("train.monitor")

__all__ = ["AnySaver", "LENS_K", "MAX_POSITIONS", "MAX_ROWS", "PATTERN_BYTES", "save_with_view", "write_first_view"]

MAX_POSITIONS = 64  # positions of the saved sample (a page shows one window of them)
MAX_ROWS = 4
PATTERN_BYTES = 384 * 1024  # each set of patterns (the sample's, the repeat's) stays under this
LENS_K = 10  # top tokens kept per lens cell (the probes show 5 by default)


def sample_size(n_layers: int, n_heads: int, rows: int, positions: int) -> tuple[int, int]:
    """(rows, positions) of a sample whose patterns [row head q k] over every layer, in float32,
    stay under PATTERN_BYTES: fewer rows first, then fewer positions."""
    per_row = lambda n: n_layers * n_heads * n * n * 4  # noqa: E731
    n = min(positions, MAX_POSITIONS)
    while n > 2 and per_row(n) > PATTERN_BYTES:
        n //= 2
    return max(1, min(rows, MAX_ROWS, PATTERN_BYTES // per_row(n))), n


def patterns(model: torch.nn.Module, ids: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """`{prefix}.pattern.L`: each attention layer's pattern [batch head q k], float32 on the CPU; and
    `{prefix}.loss` [batch pos-1], each next token's loss, from the same pass's logits where it gives
    them for every position (the development's loss on a repeat's second half, `probes.development`)."""
    result = tap_forward(model, ids, lambda call: call.pattern.detach().float().cpu())
    out = {f"{prefix}.pattern.{layer}": pattern for layer, (_, pattern) in enumerate(result.layers)}
    logits = result.logits
    if isinstance(logits, torch.Tensor) and logits.shape[:2] == ids.shape:
        out[f"{prefix}.loss"] = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none").cpu()  # [batch pos-1]
    return out


def check_model_args(model_args: dict[str, Any] | None, name: str) -> None:
    """model_args= are written into config.json and given back as keyword arguments: plain JSON data
    (an object in them failed at the first save, inside the user's loop)."""
    import json

    for key in model_args or {}:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"Monitor: model_args= keys are the {name}'s keyword arguments, got {key!r}")
        try:
            json.dumps(model_args[key], allow_nan=False)
        except (TypeError, ValueError, RecursionError) as err:
            raise ValueError(f"Monitor: model_args[{key!r}] is not plain JSON data (numbers, text, lists, dicts), "
                             f"which config.json keeps: {err}") from None


def check_state_dict(model: torch.nn.Module) -> None:
    """Every entry of the state dict a tensor: a module's get_extra_state() puts other objects there,
    which a .safetensors file cannot hold (the first save failed inside the user's loop)."""
    others = [k for k, v in model.state_dict().items() if not isinstance(v, torch.Tensor)]
    if others:
        raise ValueError(f"Monitor: save_every on a {type(model).__name__} whose state_dict holds "
                         f"{', '.join(others[:3])} ({type(model.state_dict()[others[0]]).__name__}, from get_extra_state): "
                         "a snapshot holds tensors only; leave save_every out, or save that state yourself")


class AnySaver:
    """Saves snapshots of any model; made when the Monitor is, which refuses what it cannot save."""

    def __init__(self, model: torch.nn.Module, eval_tokens: torch.Tensor | None, tokenizer: Any,
                 model_args: dict[str, Any] | None, tapped: dict[str, Any] | None):
        name = type(model).__name__
        if eval_tokens is None:
            raise ValueError(f"Monitor: save_every on a {name} needs eval_tokens= (a snapshot of a model the store "
                             "cannot rebuild keeps what the probes read from it on a sample of them)")
        if model_args is not None and not isinstance(model_args, dict):
            raise ValueError(f"Monitor: model_args= must be a dict of the keyword arguments that build the {name}, "
                             f"got a {type(model_args).__name__}")
        check_model_args(model_args, name)
        check_state_dict(model)
        self.model, self.tokenizer, self.model_args = model, tokenizer, model_args
        self.tapped = tapped or {}
        heads = self.tapped.get("n_heads") or 1
        rows, positions = sample_size(self.tapped.get("n_layers") or 1, heads, *eval_tokens.shape)
        self.sample = eval_tokens[:rows, :positions].detach().cpu().long()  # [rows positions]
        self.layout: Layout | None = None

    def readings(self, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The readings at this step, and what config.json says of them."""
        from probes import logit_lens
        from probes.common import random_repeat_tokens

        ids = self.sample.to(device)
        rows, n = ids.shape
        vocab = self.tapped.get("d_vocab")
        out: dict[str, torch.Tensor] = {"sample.tokens": self.sample.clone()}
        info: dict[str, Any] = {"rows": rows, "positions": n, "lens_k": min(LENS_K, vocab or LENS_K),
                                "windows": self.tapped.get("attn_windows") or {}}
        try:
            out.update(patterns(self.model, ids, "sample"))
            if vocab and n >= 4:
                repeat = random_repeat_tokens(vocab, n // 2, rows, seed=0)  # [rows 2*(n // 2)]
                out["repeat.tokens"] = repeat
                out.update(patterns(self.model, repeat.to(device), "repeat"))
                info["repeat"] = {"length": n // 2, "samples": rows, "seed": 0}
        except TapError as err:
            info["patterns"] = f"not read: {err}"
        if self.layout is None:
            self.layout = find_layout(self.model, ids)
        try:  # through the model's own final norm and unembedding (models.anatomy)
            lens = logit_lens.run(self.model, ids, k=min(LENS_K, vocab or LENS_K), batch_size=rows)
        except ValueError as err:  # a part the lens needs is missing: said in config.json
            info["lens"] = f"not read: {(str(err).strip().splitlines() or [''])[0]}"
        else:
            ((_, stats),) = lens.batches  # one batch: [point] of LayerStats [batch pos ...]
            for field in ("kl", "cross_entropy", "rank", "top_probs", "top_ids", "finite"):
                stacked = torch.stack([getattr(s, field).cpu() for s in stats])  # [point batch pos ...]
                out[f"lens.{field}"] = stacked.to(torch.uint8 if field == "finite" else
                                                  torch.int64 if field == "top_ids" else torch.float32)
            info["lens"] = {"points": lens.layers, "readout_error": lens.readout_error}
        return out, info

    def shape(self, n_attention: int, heads: list[int]) -> ForeignConfig:
        model, t = self.model, self.tapped
        n_heads = heads[0] if heads and len(set(heads)) == 1 else int(t.get("n_heads") or 0)
        tied = bool(self.layout and self.layout.tied)
        config = getattr(model, "config", None)  # grouped kv heads where a config names them (nanochat, HF)
        kv = next((v for v in (getattr(config, n, None) for n in ("num_key_value_heads", "n_kv_head"))
                   if isinstance(v, int) and v > 0), n_heads)
        return ForeignConfig(architecture=type(model).__name__, n_layers=n_attention or int(t.get("n_layers") or 0),
                             n_heads=n_heads, n_kv_heads=kv, d_model=int(t.get("d_model") or 0),
                             n_ctx=int(context_of(model) or t.get("n_ctx") or self.sample.shape[1]),
                             d_vocab=int(t.get("d_vocab") or 0), n_params=sum(p.numel() for p in model.parameters()),
                             unembed="tied" if tied else "separate",
                             family="transformer" if n_attention else "other")

    @torch.no_grad()
    def save(self, directory: Path, step: int, tokens_seen: int) -> Path:
        from models.store.any_model import save_any_snapshot

        device = next(self.model.parameters()).device
        with eval_pass(self.model):
            readings, info = self.readings(device)
        layers = sorted(int(k.rsplit(".", 1)[1]) for k in readings if k.startswith("sample.pattern."))
        heads = [readings[f"sample.pattern.{layer}"].shape[1] for layer in layers]
        saved = save_any_snapshot(directory, self.model, self.tokenizer, layout=self.layout,
                                  shape=self.shape(len(layers), heads), readings=readings, readings_info=info,
                                  step=step, tokens_seen=tokens_seen, model_args=self.model_args)
        from models.store.load import load_checkpoint
        from probes import page_view

        guarded(saved, lambda: page_view.save_snapshot_view(load_checkpoint(saved)))
        return saved


def save_with_view(directory: Path, model: torch.nn.Module, tokenizer: Any, **meta: Any) -> Path:
    """Our snapshot (`models.store.snapshot.save_snapshot`, `meta` its step, tokens seen...) and, beside
    it, the first view the app's pages show (`write_first_view`): how our trainer, its guard's stop and
    the Monitor save one."""
    from models.store.snapshot import save_snapshot

    saved = save_snapshot(directory, model, tokenizer, **meta)
    write_first_view(saved, model, tokenizer)
    return saved


def write_first_view(directory: Path, model: torch.nn.Module, tokenizer: Any) -> None:
    """The first view of our model (`directory` its snapshot, just saved) on the sidebar's first text,
    beside the snapshot; without a tokenizer the pages read no text, and none is saved."""
    from probes import page_view
    from probes.first_view import PAGE_TEXT, page_ids

    if tokenizer is None:
        log.info("%s: no tokenizer, so no first view: the app's pages read the model", directory)
        return
    try:
        ids = torch.tensor([page_ids(tokenizer, model.cfg.n_ctx, PAGE_TEXT)])  # [1 pos]
    except ValueError as err:  # the text has a character the vocabulary lacks
        log.info("%s: no first view (%s): the app's pages read the model", directory, str(err).splitlines()[0])
        return
    device = next(model.parameters()).device
    with eval_pass(model), torch.autocast(device.type, enabled=False):
        guarded(directory, lambda: page_view.save_first_view(directory, model, tokenizer, ids))


def guarded(directory: Path, write: Any) -> None:
    """`write()` a first view; a failure is a warning (the pages then read the model), never the end of a run."""
    try:
        write()
    except Exception as err:  # noqa: BLE001 - a view is optional; the snapshot is saved
        log.warning("%s: the first view was not saved (%s: %s); the app's pages read the model",
                    directory, type(err).__name__, err)
