"""The probes' results as the app's model pages draw them, and the first view of a snapshot
(`probes.first_view`: what its pages show first) read from its model and saved beside it.

    from probes import page_view
    page_view.attention(model, ids)                    # the Attention page's grids, [1 pos] ids
    page_view.save_first_view(snapshot_dir, model, tokenizer, ids)   # when a snapshot is saved

The app (`app/data.py`) calls the same functions on a loaded model, so a page drawn from a saved
view and one drawn from the model show the same numbers. Our trainer and the Monitor save a view
beside each snapshot (`train.monitor.save`); for snapshots saved before, or the shipped runs:

    python -m probes.page_view --ckpt checkpoints/shakespeare_gpt          # its latest snapshot
    python -m probes.page_view --ckpt runs/mine --every-snapshot
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path
from typing import Any, Callable

import torch

from models.tokenizers import token_piece
from probes.cli import run_probe
from probes.first_view import LENS_K, PAGE_K, PAGE_TEXT, PAGE_TOKEN, TABLES, pack, page_ids

log = logging.getLogger(__name__)

__all__ = ["attention", "baseline", "embedding_map", "first_view", "head_types", "lens", "main", "nearest",
           "save_first_view", "save_snapshot_view", "snapshot_ids"]

LENS_FIELDS = ("layers", "pieces", "kl_to_final", "kl_to_final_per_position", "target_rank_per_position", "top_k",
               "cross_entropy")
MAX_VIEW_VOCAB = 4096  # a larger vocabulary's tables and map are left to the page (a GPT-2 map: 50257 points)


def attention(model: Any, ids: torch.Tensor) -> dict[str, Any]:
    """Verdict and evidence per head on [1 pos] ids (`probes.degenerate`: one pass gives both entropies)."""
    from probes import degenerate

    result = degenerate.run(model, ids)
    return {"verdicts": result.verdicts, "evidence": result.evidence, "entropy": result.evidence["entropy"],
            "normalized": result.evidence["normalized_entropy"], "rows": ids.shape[1], "tokens": ids[0].tolist()}


def head_types(model: Any, ids: torch.Tensor) -> dict[str, Any]:
    """`probes.heads` on the ids, plus Olsson et al.'s induction score on random repeats (seed 0)."""
    from probes import heads

    on_text = heads.run(model, ids)
    repeat = heads.run_repeat(model, samples=8, seed=0, copying=False)
    scores = dict(on_text.scores)
    scores["induction_repeat"] = repeat.induction_repeat
    if on_text.copying is not None:
        scores["copying"] = on_text.copying
    return {"scores": scores, "repeat_length": repeat.repeat_length}


def lens(model: Any, ids: torch.Tensor, k: int, tokenizer: Any, tuned: Any = None) -> dict[str, Any]:
    """The logit lens (or the `tuned` one) on the ids: the fields the Logit lens page draws."""
    from probes import logit_lens

    data = logit_lens.run(model, ids, k=k, tokenizer=tokenizer, lens=tuned).to_dict()
    return {key: data[key] for key in LENS_FIELDS}


def nearest(model: Any, token: str, k: int, table: str, tokenizer: Any) -> dict[str, Any]:
    """`probes.neighbours` of one token, with its mean cosine (what the shuffled baseline measures)."""
    from probes import neighbours
    from probes.neighbour_baseline import mean_cosine

    result = neighbours.run(model, token, k=k, table=table, tokenizer=tokenizer).to_dict()
    result["mean_cosine"] = mean_cosine(result["neighbours"])
    return result


def baseline(model: Any, table: str, k: int) -> dict[str, Any]:
    """The table's k-nearest mean cosine against its dimension-shuffled copies (`probes.neighbour_baseline`):
    the fields of its ShuffledBaseline."""
    from probes import neighbours
    from probes.neighbour_baseline import shuffled_baseline

    queries, keys = neighbours.tables_for(model, table)
    return dataclasses.asdict(shuffled_baseline(queries, None if table != "cross" else keys, k))


def embedding_map(model: Any, table: str, tokenizer: Any) -> dict[str, Any]:
    """`probes.projection`'s 2-D map of the table, with each point's token."""
    from probes import projection

    coords, explained = projection.run(model, table)
    return {"x": coords[:, 0].tolist(), "y": coords[:, 1].tolist(), "explained": explained.tolist(),
            "pieces": [token_piece(tokenizer, i) or str(i) for i in range(coords.shape[0])]}


def first_view(model: Any, tokenizer: Any, ids: torch.Tensor) -> tuple[dict[str, Any], dict[str, str]]:
    """(parts, skipped): every part of the first view (`probes.first_view`) on [1 pos] ids; a part the
    model has not (no attention, no unembedding, a token its vocabulary lacks) is skipped, with why."""
    from probes.errors import ProbeInputError

    calls: dict[str, Callable[[], Any]] = {
        "attention": lambda: attention(model, ids), "head_types": lambda: head_types(model, ids),
        "lens": lambda: lens(model, ids, LENS_K, tokenizer)}
    vocab = getattr(getattr(model, "cfg", None), "d_vocab", None) or getattr(model, "d_vocab", None)
    if tokenizer is not None and (vocab or 0) <= MAX_VIEW_VOCAB:
        for table in TABLES:
            calls[f"baseline/{table}"] = lambda t=table: baseline(model, t, PAGE_K)
            calls[f"nearest/{table}"] = lambda t=table: nearest(model, PAGE_TOKEN, PAGE_K, t, tokenizer)
            if table != "cross":
                calls[f"map/{table}"] = lambda t=table: embedding_map(model, t, tokenizer)
    parts, skipped = {}, {}
    with torch.no_grad():
        for name, call in calls.items():
            try:
                parts[name] = call()
            except (ProbeInputError, ValueError) as err:  # the page says it again when asked
                skipped[name] = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return parts, skipped


def save_first_view(directory: str | Path, model: Any, tokenizer: Any, ids: torch.Tensor,
                    text: str | None = PAGE_TEXT) -> Path:
    """The first view of `model` (the snapshot saved at `directory`) on [1 pos] ids, which encode
    `text` (None: a saved sample's row), written beside it (`models.store.view_file`)."""
    from models.store.files import read_json_object
    from models.store.view_file import write_view

    directory = Path(directory)
    weights = read_json_object(directory / "config.json").get("tensors_sha256")
    parts, skipped = first_view(model, tokenizer, ids)
    arrays, skeleton = pack(parts)
    info = {"weights_sha256": weights, "tokens": ids[0].tolist(), "text": text, "skipped": skipped, "parts": skeleton}
    return write_view(directory, arrays, info)


def save_snapshot_view(snap: Any) -> Path:
    """The first view of a loaded snapshot, on what its pages read first (`snapshot_ids`), saved beside it."""
    ids, text = snapshot_ids(snap)
    return save_first_view(snap.path, snap.model, snap.tokenizer, ids, text)


def snapshot_ids(snap: Any, text: str = PAGE_TEXT) -> tuple[torch.Tensor, str | None]:
    """([1 pos] ids, the text they encode) a page reads first on a loaded snapshot: `text` cut to its
    context, or for a snapshot of any model without its code row 0 of its saved sample (text None)."""
    from probes.common import sample_only, saved_sample

    if sample_only(snap):
        return saved_sample(snap)[0][:1], None
    if snap.tokenizer is None:
        raise ValueError(f"{snap.name} has no tokenizer: its pages read no text")
    return torch.tensor([page_ids(snap.tokenizer, snap.config.n_ctx, text)]), text


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m probes.page_view", description=(
        "Save the first view beside a snapshot: what the app's model pages show first, so that they draw "
        "it before the model loads (our trainer and the Monitor save one with each snapshot)."))
    parser.add_argument("--ckpt", required=True, nargs="+", type=Path,
                        help="snapshot or run directories (a run: its latest snapshot)")
    parser.add_argument("--every-snapshot", action="store_true", help="every snapshot of each run, not its latest")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, save_views)


def save_views(args: argparse.Namespace) -> None:
    """Each view's line printed as it is saved (no JSON: the files are the output), so that a later
    snapshot's bad input still leaves the views saved before it said."""
    from models.checkpoint import list_snapshots, load_checkpoint

    torch.set_num_threads(1)  # as the app reads its models (app.data.load): the same numbers
    for path in args.ckpt:
        for snapshot in (list_snapshots(path) if args.every_snapshot else [path]):
            saved = save_snapshot_view(load_checkpoint(snapshot))
            print(f"{saved} ({saved.stat().st_size / 1000:.1f} kB)")


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
