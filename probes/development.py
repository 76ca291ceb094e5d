"""The run's development: what each head becomes across every snapshot of a run, and when.

    from probes import development
    result = development.run("runs/mine")              # every snapshot, cached beside each one
    result.snapshots[-1]["scores"]["induction"][1][0]  # a head's score at the last snapshot
    result.phase_changes                               # [{"kind", "step", "heads", "evidence"}]
    result.to_dict()                                   # == python -m probes.development --ckpt runs/mine --json

Per snapshot (`read_snapshot`), on one set of text windows for the whole run (the validation split
of the run's data, `--data`, or given tokens) and one random repeat (`probes.common.random_repeat_tokens`,
8 sequences of n_ctx // 2 tokens repeated twice, seed 0, as the first view reads):
- per head: the normalised entropy (`probes.entropy`: H_i / ln k_i, window-aware) and the head-type
  scores of `probes.heads` on the text (previous_token, duplicate_token, induction, sink) plus Olsson
  et al.'s induction score on the repeat (`induction_repeat`), which is what the phase changes read
  as "induction" (random tokens repeat only where the repeat puts them);
- per lens point (embed, 0_post, ...): the logit lens's KL(final || layer) (`probes.logit_lens`);
- `loss`: the model's mean loss on the text; `icl_score`: Olsson et al.'s in-context score, the mean
  loss late in the context (the last tenth of the positions) minus early (positions 5%..15% in), negative
  when later tokens are predicted better; `repeat_loss`: the loss on the repeat's second half (the
  tokens a copy predicts; the first token of the copy excluded).

Snapshots: a run's `step_*` directories, a folder of nanoGPT checkpoint files (`ckpt_500.pt`), a folder
of Hugging Face Trainer `checkpoint-N` directories, or one snapshot alone. A snapshot of any model
saved without its code reads what the Monitor saved (its sample's patterns and lens, its repeat's
patterns and per-token loss; one saved before the Monitor kept that loss has `repeat_loss` null, said
in `missing`).
Each reading is cached beside its snapshot (`development.json`, or `NAME.development.json` beside a
checkpoint file) keyed by the weights' hash and the inputs' hash; a stale one is recomputed (logged).
The phase changes are `probes.development_parts.phase_changes`' (sharp moves of a score, grouped, aligned with the loss);
each one's heads are ablated at the snapshot ending it (`probes.development_parts.phase_ablation`: the repeat's loss with
and without them, `ablation`).
"""

from __future__ import annotations

if __name__ == "__main__":  # --help and bad arguments answered before torch is imported
    from probes.args import development_parser
    development_parser().parse_early()

import json
import logging
import math
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from probes.args import development_parser as build_parser
from probes.cli import run_probe
from probes.development_parts.cache import cache_path, read_cache, weights_file, weights_key, write_cache
from probes.development_parts.inputs import Inputs, run_inputs
from probes.development_parts.phase_ablation import ablate_changes
from probes.development_parts.phase_changes import phase_changes
from probes.errors import ProbeInputError

log = logging.getLogger(__name__)

__all__ = ["DevelopmentResult", "icl_score", "main", "read_snapshot", "repeat_half_loss", "run", "snapshot_paths"]

SAY_COST_S = 60.0  # a read expected to take longer says so after its first snapshot
HF_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
CANNOT = ("it cannot read a folder of the series' .pt state dicts (each needs --preset: one snapshot at a time), "
          "nor snapshots of different models as one run")


# ---------------------------------------------------------------- pure functions

def icl_score(losses: torch.Tensor) -> float:
    """Olsson et al.'s in-context score from per-position losses [batch n]: the mean loss over the last
    tenth of the positions minus the mean over positions 5%..15% into the context."""
    n = losses.shape[-1]
    if n < 3:
        raise ProbeInputError(f"an in-context score needs 3+ predicted positions, got {n}")
    early_from = math.floor(0.05 * n)
    early_to = max(early_from + 1, math.ceil(0.15 * n))
    late_from = min(n - 1, math.floor(0.9 * n))
    return float(losses[..., late_from:].mean() - losses[..., early_from:early_to].mean())


def position_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each next token: logits [batch pos vocab], tokens [batch pos] -> [batch pos-1]."""
    logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)  # [batch pos-1 vocab]
    return -logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)


def repeat_half_loss(logits: torch.Tensor, tokens: torch.Tensor, length: int) -> float:
    """Mean loss on the second copy of tokens [batch 2*length] repeated with period `length`: the
    predictions of tokens length+1 .. 2*length-1 (the copy's first token follows nothing repeated)."""
    losses = position_losses(logits, tokens)  # [batch 2*length-1]: row i predicts token i+1
    return float(losses[:, length:].mean())


# ---------------------------------------------------------------- one snapshot

def model_logits(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """The model's logits [batch pos vocab] on tokens [batch pos] (a (logits, ...) tuple or an output
    with .logits read as such); one line where it gives logits for fewer positions (nanoGPT's last one)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    out = model(tokens.to(device))
    logits = out[0] if isinstance(out, tuple) else getattr(out, "logits", out)
    if not isinstance(logits, torch.Tensor) or logits.shape[:2] != tokens.shape:
        raise ProbeInputError(f"{type(model).__name__} returns no logits for every position of a [batch pos] input")
    return logits.float().cpu()


def measure(model: Any, tokens: torch.Tensor, repeat: tuple[torch.Tensor, int]) -> dict[str, Any]:
    """A reading of a model (ours, a bridge, any module, or a snapshot's saved readings) on [batch pos]
    text windows and a random repeat (tokens [samples 2*length], length)."""
    from models.store.any_model import SavedModel
    from probes import entropy, heads, logit_lens

    saved, missing = isinstance(model, SavedModel), []
    on_text = heads.run(model, tokens, copying=False)
    rep = (heads.run_repeat(model, copying=False) if saved
           else heads.run(model, repeat[0], repeat_period=repeat[1], copying=False))
    reading: dict[str, Any] = {
        "entropy": entropy.run(model, tokens).entropy_normalized,
        "scores": {**on_text.scores, "induction_repeat": rep.induction_repeat}, "lens_points": None,
        "lens_kl": None, "loss": None, "icl_score": None, "repeat_loss": None, "repeat_length": rep.repeat_length}
    losses = None
    try:
        lens = logit_lens.run(model, tokens, k=1)
        reading.update(lens_points=lens.layers, lens_kl=lens.kl_to_final)
        if saved:  # the lens's last point is the model's own readout: its loss per position
            last = lens.per_position("cross_entropy")[-1]  # [sequence][pos], None at each last position
            losses = torch.tensor([[v for v in row if v is not None] for row in last], dtype=torch.float64)
    except ProbeInputError as err:
        missing.append(f"lens_kl: {err}")
    try:
        if not saved:
            losses = position_losses(model_logits(model, tokens), tokens)  # [batch pos-1]
            reading["repeat_loss"] = repeat_half_loss(model_logits(model, repeat[0]), repeat[0], repeat[1])
        elif "repeat.loss" in model.readings():  # each next token's loss on the saved repeat [rows 2L-1]
            saved_losses = torch.as_tensor(model.readings()["repeat.loss"]).double()
            reading["repeat_loss"] = float(saved_losses[:, rep.repeat_length:].mean())
        else:
            missing.append("repeat_loss: the snapshot saved no loss on its repeat (saved before it did)")
    except ProbeInputError as err:
        missing.append(f"loss, icl_score and repeat_loss: {err}")
    if losses is not None:
        reading.update(loss=float(losses.mean()), icl_score=icl_score(losses))
    reading["missing"] = missing
    return reading


def read_snapshot(path: Path, inputs: Inputs, *, cache: bool = True, from_cache: bool = True) -> dict[str, Any]:
    """The reading of the snapshot at `path`: from its cache when it matches (and `from_cache`), else
    measured (and cached, with `cache`). Its step is the snapshot's own, never the cache's."""
    key = weights_key(path)
    where = cache_path(path)
    if cache and from_cache and key is not None:
        found = read_cache(where, key, inputs.key)
        if found is not None:
            step = step_in_name(path)  # a snapshot copied to another step with its cache: the folder's
            return {**found, "step": found["step"] if step is None else step, "snapshot": path.name, "from": "cache"}
    from models.checkpoint import load_checkpoint

    snap = load_checkpoint(path)
    tokens, repeat = inputs.for_snapshot(snap)
    check_vocabulary(path, snap, inputs, tokens, repeat[0])
    with torch.no_grad():
        try:
            reading = measure(snap.model, tokens, repeat)
        except ProbeInputError as err:  # which snapshot of which run
            raise ProbeInputError(f"{path}: {err}") from None
    reading = {"step": snapshot_step_of(path, snap), "snapshot": path.name, **reading}
    if cache and key is not None:
        write_cache(where, key, inputs.key, reading)
    return {**reading, "from": "computed"}


def step_in_name(path: Path) -> int | None:
    """The step a snapshot's name gives (step_000500, ckpt_500.pt, checkpoint-500), else None."""
    from models.store.run import snapshot_step

    found = snapshot_step(path)
    match = HF_CHECKPOINT.match(path.name)
    return int(match.group(1)) if found is None and match else found


def snapshot_step_of(path: Path, snap: Any = None) -> int:
    found = step_in_name(path)
    if found is None and snap is not None and isinstance(snap.step, int):
        found = snap.step
    return found or 0


def check_vocabulary(path: Path, snap: Any, inputs: Inputs, *tokens: torch.Tensor) -> None:
    """The run's text, tokenized for its latest snapshot, fits this one's vocabulary: else one line
    naming the snapshot and the run's text (snapshots of different vocabularies are no one run)."""
    vocab = getattr(getattr(snap, "config", None), "d_vocab", None)
    top = max((int(t.max()) for t in tokens if t.numel()), default=-1)
    if isinstance(vocab, int) and top >= vocab:
        raise ProbeInputError(f"{path}: a vocabulary of {vocab} tokens, but the run's text ({inputs.source}, "
                              f"tokenized for its latest snapshot) holds token id {top}: the run's snapshots "
                              f"have different vocabularies; {CANNOT}")


# ---------------------------------------------------------------- the run

def snapshot_paths(run_path: str | Path) -> list[Path]:
    """A run's snapshots in step order: step_* directories, checkpoint files, Hugging Face Trainer
    checkpoint-N directories, or a lone snapshot (itself)."""
    from models.store.run import is_snapshot_dir, list_snapshots

    path = Path(run_path)
    if not path.exists():
        raise ProbeInputError(f"{path}: no such run or snapshot")
    if path.is_file() or is_snapshot_dir(path):
        return [path]
    found = list_snapshots(path)
    if not found:
        found = sorted((p for p in path.iterdir() if p.is_dir() and HF_CHECKPOINT.match(p.name)),
                       key=lambda p: int(HF_CHECKPOINT.match(p.name).group(1)))
    if not found and (path / "ckpt.pt").is_file():
        return [path / "ckpt.pt"]  # nanoGPT's out_dir: its one checkpoint
    if not found and (path / "config.json").is_file():
        return [path]  # a Hugging Face model directory: one snapshot
    if not found:
        raise ProbeInputError(f"{path}: no snapshots (step_*/, ckpt_N.pt files or checkpoint-N/); {CANNOT}")
    return found


def loss_curve(run_path: Path) -> list[tuple[int, float]]:
    """(step, loss) of the run's training loss (val loss where it logged none), read as the run doctor
    reads a history (ours, a Trainer's trainer_state.json, TensorBoard, nanoGPT's log); [] where none."""
    from probes.doctor.run_history import RunHistory

    try:
        history = RunHistory.read(run_path)
    except (ValueError, OSError) as err:  # no history, or one the doctor cannot read: no loss chart
        log.info("%s: no loss history (%s)", run_path, str(err).splitlines()[0] if str(err) else err)
        return []
    for key in ("train_loss", "val_loss"):
        curve = [(int(s), v) for s, v in history.series(key) if math.isfinite(v)]
        if curve:
            return sorted(curve)
    return []


@dataclass
class DevelopmentResult:
    run: str
    source: str
    snapshots: list[dict[str, Any]]
    phase_changes: list[dict[str, Any]]
    loss_curve: list[tuple[int, float]]
    notes: list[str] = field(default_factory=list)  # what could not be ablated

    def to_dict(self) -> dict[str, Any]:
        from models.cli import to_jsonable
        return to_jsonable({"snapshots": self.snapshots, "phase_changes": self.phase_changes})

    def format(self) -> str:
        lines = [f"run: {self.run} ({len(self.snapshots)} snapshot(s), read on {self.source})",
                 f"{'step':>8} {'loss':>7} {'icl':>7} {'repeat':>7}  strongest induction / previous-token head"]
        for s in self.snapshots:
            best = {k: strongest(s["scores"].get(k)) for k in ("induction_repeat", "previous_token")}
            cells = [f"{v:7.3f}" if isinstance(v, float) else f"{'-':>7}" for v in (s["loss"], s["icl_score"],
                                                                               s["repeat_loss"])]
            lines.append(f"{s['step']:>8} " + " ".join(cells) + "  " + "  ".join(
                f"{k}: L{b[0]}H{b[1]} {b[2]:.2f}" for k, b in best.items() if b))
        lines.append("phase changes:" if self.phase_changes else "phase changes: none")
        for c in self.phase_changes:
            heads = ", ".join(f"L{l}H{h}" for l, h in c["heads"])
            ev = c["evidence"]
            repeat = ev.get("repeat_loss")
            drop = f"; repeat loss {repeat['before']:.2f} -> {repeat['after']:.2f}" if repeat else ""
            low, high = ev["crossed_between"]
            lines.append(f"  step {c['step']} (between the snapshots at {low} and {high}): {c['kind']} ({heads}; "
                         f"steps {ev['from_step']}..{ev['to_step']}{drop})")
            lines += [f"    {ablation_text(c['ablation'])}"] if c.get("ablation") else []
        missing = sorted({m for s in self.snapshots for m in s.get("missing", [])}) + self.notes
        lines += [f"missing: {m}" for m in missing]
        return "\n".join(lines)


def ablation_text(ablation: dict[str, Any]) -> str:
    """One line: the repeat's loss at the ablated snapshot with the heads and without them."""
    loss = ablation["repeat_loss"]
    each = ", ".join(f"L{e['head'][0]}H{e['head'][1]} {e['without']:.2f}" for e in ablation["each"])
    return (f"{ablation['how']}-ablated at step {ablation['step']}: repeat loss {loss['with']:.2f} with them, "
            f"{loss['without']:.2f} without" + (f" (each alone: {each})" if each else ""))


def strongest(grid: list[list[float]] | None) -> tuple[int, int, float] | None:
    if not grid:
        return None
    return max(((l, h, v) for l, row in enumerate(grid) for h, v in enumerate(row) if v is not None),
               key=lambda c: c[2], default=None)


def grids_of(snapshots: list[dict[str, Any]]) -> dict[str, list]:
    """The score series phase changes read: [snapshot][layer][head] per kind (induction: Olsson's)."""
    out = {"entropy": [s["entropy"] for s in snapshots]}
    for name in ("previous_token", "duplicate_token", "sink"):
        out[name] = [s["scores"][name] for s in snapshots]
    out["induction"] = [s["scores"].get("induction_repeat") or s["scores"]["induction"] for s in snapshots]
    return out


def shape_of(reading: dict[str, Any]) -> str:
    return json.dumps([len(row) for row in reading["entropy"]])


def read_all(paths: list[Path], inputs: Inputs, cache: bool, shown: Any) -> dict[Path, dict[str, Any]]:
    """Each snapshot's reading; after the second one measured (the first pays for warming up), a
    long read says what it will cost."""
    read: dict[Path, dict[str, Any]] = {}
    measured = 0
    for n, p in enumerate(shown):
        start = time.perf_counter()
        read[p] = read_snapshot(p, inputs, cache=cache)
        took, left = time.perf_counter() - start, len(paths) - n - 1
        measured += read[p]["from"] == "computed"
        if measured == 2 and read[p]["from"] == "computed" and took * left > SAY_COST_S:
            log.warning("development: %d more snapshots to read, about %.0f s (%.2f s each); each reading is "
                        "cached beside its snapshot, so the next look is quick", left, took * left, took)
    return read


def run(run_path: str | Path, *, tokens: Any = None, data: str | Path | None = None, samples: int = 8,
        seed: int = 0, cache: bool = True, progress: bool | None = None, ablation: str | None = "zero") -> DevelopmentResult:
    """The development of the run at `run_path` (see the module's docstring); `tokens` ([batch pos]
    ids) or `data` (a text file) replace the run's own text; `cache=False` neither reads nor writes caches;
    `ablation`: how each phase change's heads are ablated ("zero", "mean"; None: not ablated)."""
    from probes.common import one_thread_if_tiny, progress_bar

    path = Path(run_path)
    paths = snapshot_paths(path)
    inputs = run_inputs(paths[-1], tokens, None if data is None else Path(data), samples, seed)
    with one_thread_if_tiny(weights_file(paths[-1])):
        read = read_all(paths, inputs, cache, progress_bar(paths, progress, "development"))
        if len({shape_of(s) for s in read.values()}) > 1:  # a cached reading of another shape is stale
            log.warning("%s: readings of different layers or heads: the cached ones recomputed", path)
            read.update({p: read_snapshot(p, inputs, cache=cache, from_cache=False)
                         for p, s in read.items() if s["from"] == "cache"})
    snapshots = sorted(read.values(), key=lambda s: s["step"])
    if len({shape_of(s) for s in snapshots}) > 1:
        raise ProbeInputError(f"{path}: its snapshots have different layers or heads; one model's run is read")
    curve = loss_curve(path if paths[0] != path else path.parent)
    grids = grids_of(snapshots)
    changes = phase_changes([s["step"] for s in snapshots], grids,
                            repeat_loss=[s["repeat_loss"] for s in snapshots],
                            icl_score=[s["icl_score"] for s in snapshots], loss_curve=curve)
    notes = ablate_changes(changes, snapshots, paths, inputs.repeat, ablation) if ablation else []
    return DevelopmentResult(str(path), inputs.source, snapshots, changes, curve, notes)


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> DevelopmentResult:
    return run(args.ckpt, data=args.data, samples=args.samples, seed=args.seed, cache=not args.no_cache,
               progress=args.progress, ablation=None if args.ablation == "none" else args.ablation)


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main(sys.argv[1:]))
