"""What the app reads, cached: the runs on disk, loaded models, and probe results as plain values
(what it reads from a run's folder with no model is app/run_files.py).

Models are `st.cache_resource` keyed by path and modification time (a retrained snapshot is
reloaded); probe results are `st.cache_data` keyed by plain values. Every number comes from a
probe (`probes.*`, shaped for the pages by `probes.page_view`) or a run reader (`models.*`); this
module only reshapes them for charts.

A page's first chart needs no model: the probes' results for what a model page shows first (the
sidebar's first text, the first token...) are saved beside each snapshot (`probes.first_view`),
and a probe call asking for exactly that returns them, read with the snapshot's front (config and
tokenizer, `models.store.front`) without torch. Anything else (another text, another head) loads
the model. torch, TransformerLens (which our models' hook points need) and the probes are
imported where they are used, not here: they take ~2-9 s to import on a 2-core machine. `app.warm`
loads them in the background once the first page is drawn.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import streamlit as st

from app.logs import foreign_log, history_only, stamp
from app.model_code import spec_for
from app.tokenizer_help import no_tokenizer
from models.store.front import Front
from models.store.run import is_run_dir, is_snapshot_dir, list_snapshots
from models.tokenizers import token_piece
from probes.first_view import LENS_K, PAGE_K, PAGE_TOKEN, page_ids

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Source:
    """A run directory (with its snapshots) or a single snapshot / series .pt file."""

    path: Path
    preset: str | None = None  # for a bare .pt state dict
    name: str | None = field(default=None, compare=False)  # unique in the run list (app.catalog.labelled)

    @property
    def is_run(self) -> bool:
        return is_run_dir(self.path)

    @property
    def label(self) -> str:
        return self.name or self.path.name

    def snapshots(self) -> list[Path]:  # a lone checkpoint is its own; a log (or a folder of one) has none
        return list_snapshots(self.path) if self.is_run else [] if history_only(self.path) else [self.path]


def _loadable(path: Path) -> bool:
    """A run (ours, or a folder of numbered nanoGPT checkpoints), a snapshot or Hugging Face GPT-2
    directory (both have a config.json), a nanoGPT out_dir with its ckpt.pt, or a folder holding
    another trainer's log the doctor reads (a Trainer's output, TensorBoard events right in it)."""
    return is_run_dir(path) or is_snapshot_dir(path) or (path / "ckpt.pt").is_file() or \
        foreign_log(path, event_levels=0) is not None


def discover(roots: list[Path]) -> list[Source]:
    """Run directories under each root (or the root itself when it is a run or snapshot)."""
    found: list[Source] = []
    for root in roots:
        if _loadable(root):
            found.append(Source(root))
        elif root.is_dir():
            found += [Source(p) for p in sorted(root.iterdir()) if p.is_dir() and _loadable(p)]
    unique: dict[Path, Source] = {}
    for source in found:  # a run named twice (--runs and checkpoints/) is listed once, first place
        unique.setdefault(source.path.resolve(), source)
    return list(unique.values())


def mtime(path: Path) -> float:
    """Newest modification time of a snapshot's files (cache key: retrained means reloaded); a
    checkpoint file's folder too, so a tokenizer put beside it is read on the next rerun."""
    files = [path, path.parent] if path.is_file() else list(path.iterdir()) if path.is_dir() else []
    return max((stamp(f) for f in files if not f.name.startswith(".")), default=0.0)  # a write's temporary: skipped


@st.cache_resource(max_entries=8, show_spinner="Loading the model...")
def load(path: str, modified: float, preset: str | None = None) -> Any:
    """A Snapshot (model in eval mode, tokenizer, config, meta); `modified` keys the cache."""
    import torch

    from models.checkpoint import load_checkpoint

    torch.set_grad_enabled(True)
    # one intra-op thread by default: the models are small, and with two on a shared 2-core machine
    # OpenMP's spin-waits made the Overview's 160-token sample take 22 s instead of 1 s (as
    # tests/conftest.py); SCRATCHSCOPE_TORCH_THREADS=N gives a GPT-2-sized model more
    torch.set_num_threads(torch_threads())
    return load_checkpoint(path, preset=preset, model_code=spec_for(Path(path)))  # only on the user's word


def torch_threads() -> int:
    """Intra-op threads for the app's torch: SCRATCHSCOPE_TORCH_THREADS (a positive integer), else 1."""
    raw = os.environ.get("SCRATCHSCOPE_TORCH_THREADS") or "1"  # unset or empty: the default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"SCRATCHSCOPE_TORCH_THREADS={raw!r} is not a positive integer")
    return int(raw)


def snapshot(path: Path, preset: str | None = None) -> Any:
    return load(str(path), mtime(path), preset)


def opening(path: Path, preset: str | None = None) -> Any:
    """What a page reads of a snapshot before its first chart: its front (config, tokenizer, meta,
    path, step; no torch), or for a format without one the loaded snapshot, which has them too."""
    return front(str(path), mtime(path), preset) or snapshot(path, preset)


@st.cache_resource(max_entries=16, show_spinner=False)
def front(path: str, modified: float, preset: str | None = None) -> Front | None:
    """The snapshot's front (`models.store.front`), None for another format or one that does not read
    (loading the model then says why, in the page); `modified` keys the cache."""
    from models.store.front import read_front

    if preset is not None:
        return None
    try:
        return read_front(path)
    except (ValueError, OSError) as err:
        log.info("%s: no front (%s): the model is loaded", path, err)
        return None


@dataclass(frozen=True)
class View:
    """The first view saved beside a snapshot: its parts (`probes.first_view`) and the ids they read."""

    parts: dict[str, Any]
    tokens: list[int]


@st.cache_resource(max_entries=16, show_spinner=False)
def first_view(path: str, modified: float, preset: str | None = None) -> View | None:
    """The snapshot's saved first view, None without one (or a stale or damaged one: the pages then
    read the model)."""
    from models.store.view_file import read_view
    from probes.first_view import unpack

    found = front(path, modified, preset)
    try:
        saved = None if found is None else read_view(found.path, found.meta.get("tensors_sha256"))
        if saved is None:
            return None
        arrays, info = saved
        return View(unpack(arrays, info["parts"], found.tokenizer), list(info["tokens"]))
    except (ValueError, OSError, KeyError, TypeError) as err:
        log.warning("%s: its first view is not read (%s): the model is loaded", path, err)
        return None


def saved(path: str, modified: float, preset: str | None, part: str, text: str | None = None) -> Any:
    """The saved first view's `part` when it answers the page's call: on `text`, when the view read that
    text's ids (a snapshot of any model without its code reads its saved sample whatever the text);
    None otherwise."""
    view = first_view(path, modified, preset)
    if view is None or part not in view.parts:
        return None
    snap = front(path, modified, preset)
    if text is not None and not saved_only(snap):
        try:
            if snap.tokenizer is None or not text or page_ids(snap.tokenizer, snap.config.n_ctx, text) != view.tokens:
                return None
        except ValueError:  # a character the vocabulary lacks: the model's path says so
            return None
    return view.parts[part]


def has_saved(sel: Any, *parts: str) -> bool:
    """Whether the saved first view answers each of `parts` for the selection (`app.views.common.Selection`)."""
    path, modified, preset = sel.key
    return all(saved(path, modified, preset, part, sel.text) is not None for part in parts)


def encode(snap: Any, text: str) -> torch.Tensor:
    """[1 pos] ids of `text` cut to the model's context (the app shows one window); for a snapshot of
    any model without its code, the first row of the sample it saved (`saved_only` says so)."""
    import torch

    if saved_only(snap):
        from probes.common import saved_sample
        return saved_sample(snap)[0][:1]
    if not text:
        raise ValueError("the text is empty: type some text in the sidebar")
    if snap.tokenizer is None:
        raise no_tokenizer(snap)
    return torch.tensor([page_ids(snap.tokenizer, snap.config.n_ctx, text)])


def saved_only(snap: Any) -> bool:
    """A snapshot of any model opened without its code: its pages read the sample it saved."""
    if isinstance(snap, Front):
        return snap.kind == "any-model" and spec_for(snap.path) is None
    from probes.common import sample_only  # a loaded snapshot: torch is in already

    return sample_only(snap)


def pieces(snap: Any, ids: list[int]) -> list[str]:
    return [token_piece(snap.tokenizer, i) or str(i) for i in ids]


def shown(piece: str) -> str:
    """Whitespace made visible for axis labels."""
    return piece.replace("\n", NEWLINE).replace(" ", "␣").replace("\t", "⇥") or "∅"


NEWLINE = "⏎"  # a new line where a one-line box must show it


def shown_newlines(text: str) -> str:
    """`text` for a one-line input box, where a new line would vanish ("ROMEO:\\nBut" read "ROMEO:But")."""
    return text.replace("\n", NEWLINE)


def real_newlines(text: str) -> str:
    """What `shown_newlines` showed, back to the text itself."""
    return text.replace(NEWLINE, "\n")


# --------------------------------------------------------------------------- probes (cached)


@st.cache_data(max_entries=64, show_spinner="Measuring attention...")
def attention(path: str, modified: float, text: str, preset: str | None = None) -> dict[str, Any]:
    found = saved(path, modified, preset, "attention", text)
    if found is not None:
        return found
    from probes import page_view

    snap = load(path, modified, preset)
    return page_view.attention(snap.model, encode(snap, text))


@st.cache_data(max_entries=64, show_spinner=False)
def head(path: str, modified: float, text: str, layer: int, head_index: int,
         preset: str | None = None) -> dict[str, Any]:
    from probes import entropy

    snap = load(path, modified, preset)
    ids = encode(snap, text)
    pattern, row_entropy = entropy.head_pattern(snap.model, ids, layer, head_index)
    return {"pattern": pattern.tolist(), "row_entropy": row_entropy.tolist(),
            "pieces": pieces(snap, ids[0].tolist())}


@st.cache_data(max_entries=64, show_spinner=False)
def layer_patterns(path: str, modified: float, text: str, layer: int, preset: str | None = None) -> dict[str, Any]:
    """Every head's pattern in one layer (probes.entropy.layer_patterns): [head q k] as lists."""
    from probes import entropy

    snap = load(path, modified, preset)
    ids = encode(snap, text)
    patterns = entropy.layer_patterns(snap.model, ids, layer)  # [head q k]
    return {"patterns": patterns.tolist(), "pieces": pieces(snap, ids[0, :patterns.shape[-1]].tolist())}


@st.cache_data(max_entries=64, show_spinner="Running the logit lens...")
def lens(path: str, modified: float, text: str, k: int = LENS_K, preset: str | None = None) -> dict[str, Any]:
    found = saved(path, modified, preset, "lens", text) if k == LENS_K else None
    if found is not None:
        return found
    from probes import page_view

    snap = load(path, modified, preset)
    return page_view.lens(snap.model, encode(snap, text), k, snap.tokenizer)


@st.cache_data(max_entries=64, show_spinner=False)
def nearest(path: str, modified: float, token: str, k: int, table: str,
            preset: str | None = None) -> dict[str, Any]:
    found = saved(path, modified, preset, f"nearest/{table}") if (token, k) == (PAGE_TOKEN, PAGE_K) else None
    if found is not None:
        return found
    from probes import page_view

    snap = load(path, modified, preset)
    if snap.tokenizer is None:
        raise no_tokenizer(snap)
    return page_view.nearest(snap.model, token, k, table, snap.tokenizer)


@st.cache_data(max_entries=16, show_spinner="Shuffling the table for a baseline...")
def neighbour_baseline(path: str, modified: float, table: str, k: int, preset: str | None = None) -> Any:
    """The table's k-nearest mean cosine against its dimension-shuffled copies (probes.neighbour_baseline)."""
    from probes.neighbour_baseline import ShuffledBaseline

    found = saved(path, modified, preset, f"baseline/{table}") if k == PAGE_K else None
    if found is None:
        from probes import page_view
        found = page_view.baseline(load(path, modified, preset).model, table, k)
    return ShuffledBaseline(**found)


@st.cache_data(max_entries=16, show_spinner="Projecting the embedding table...")
def embedding_map(path: str, modified: float, table: str, preset: str | None = None) -> dict[str, Any]:
    found = saved(path, modified, preset, f"map/{table}")
    if found is not None:
        return found
    from probes import page_view

    snap = load(path, modified, preset)
    return page_view.embedding_map(snap.model, table, snap.tokenizer)


@st.cache_data(max_entries=32, show_spinner=False)
def sample(path: str, modified: float, prompt: str, n: int, greedy: bool, temperature: float,
           seed: int, preset: str | None = None) -> str:
    from models.sample import continue_text

    snap = load(path, modified, preset)
    if snap.tokenizer is None:
        raise no_tokenizer(snap)
    return continue_text(snap, prompt, n, greedy=greedy, temperature=temperature, seed=seed)


# --------------------------------------------------------------------------- tuned lens


def tuned_lens_mtime(snapshot_path: Path) -> float | None:
    """Modification time of the snapshot's tuned lens (cache key), or None when it has none."""
    from probes.lens.tuned_file import lens_paths

    files = lens_paths(snapshot_path)
    return max(p.stat().st_mtime for p in files) if all(p.is_file() for p in files) else None


@st.cache_data(max_entries=64, show_spinner="Running the tuned lens...")
def tuned(path: str, modified: float, lens_modified: float, text: str, k: int = 5,
          preset: str | None = None) -> dict[str, Any]:
    """The tuned lens saved beside the snapshot, on the text: the logit lens's fields plus the
    translators' training record; raises ProbeInputError (one line) for a lens of another model."""
    from probes import page_view, tuned_lens

    snap = load(path, modified, preset)
    lens = tuned_lens.load(snap)
    out = page_view.lens(snap.model, encode(snap, text), k, snap.tokenizer, tuned=lens)
    out["trained"] = {key: lens.meta.get(key) for key in ("steps", "batch_size", "seed", "data")}
    return out


# --------------------------------------------------------------------------- head types, attribution (issue 21)

@st.cache_data(max_entries=64, show_spinner="Scoring head types...")
def head_types(path: str, modified: float, text: str, preset: str | None = None) -> dict[str, Any]:
    """probes.heads on the text, plus Olsson et al.'s induction score on random repeats (seed 0)."""
    found = saved(path, modified, preset, "head_types", text)
    if found is not None:
        return found
    from probes import page_view

    snap = load(path, modified, preset)
    return page_view.head_types(snap.model, encode(snap, text))


@st.cache_data(max_entries=64, show_spinner="Attributing the logit...")
def attribution(path: str, modified: float, text: str, position: int, target: str | None,
                versus: str | None, preset: str | None = None) -> dict[str, Any]:
    """probes.attribution at one position of the text's first window."""
    from probes import attribution as direct
    snap = load(path, modified, preset)
    return direct.run(snap.model, encode(snap, text), position=position, target=target or None,
                      versus=versus or None, tokenizer=snap.tokenizer).to_dict()
