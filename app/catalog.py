"""Which runs the app knows: their labels, the paths a user types, `?run=` links, and the landing
view's one-line summary of each run.

A label is the directory's name, a snapshot inside a run is `run/step_NNNNNN`, and two sources
with one name get their parent folder in brackets, so that every entry of the run list differs.
The summaries read `run.json`, `metrics.jsonl` and each checkpoint's config (`models.store.peek`:
no model is built) and the run doctor's cached verdict.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import streamlit as st

from app import data, logs, run_files
from app.logs import is_log_file, logs_in
from app.views.common import first_line
from models.store.nanochat_files import is_nanochat
from models.store.run import is_run_dir, is_snapshot_dir, list_snapshots, read_metrics, read_run_json
from probes.doctor.run_history import is_finite
from probes.doctor.signals import nonfinite_in
from probes.sweep import loss_text
from probes.sweep_parts.stats import SWEEP_FILE


def base_name(path: Path) -> str:
    """A snapshot inside a run reads `run/step_NNNNNN` and a run inside a sweep `sweep/run` (its
    own name, `lr=1e-01,qk_norm=rms`, says nothing of which sweep); anything else its directory
    or file name."""
    inside_sweep = in_sweep(path)
    inside_run = is_snapshot_dir(path) and is_run_dir(path.parent)
    return f"{path.parent.name}/{path.name}" if inside_sweep or inside_run else path.name


def shown(source: data.Source) -> str:
    """What a run box or a link shows for a source: a sweep's run its own name first, then its sweep
    (`lr=1e-03,qk_norm=none · sweep_qk_norm`), so that a box or a column too narrow for the whole
    cuts what the sweep's runs share, never the part that tells them apart; anything else its label."""
    path, label = source.path, source.label
    head = f"{path.parent.name}/{path.name}"
    if not label.startswith(head) or not in_sweep(path):
        return label
    return f"{path.name} · {path.parent.name}{label[len(head):]}"


def in_sweep(path: Path) -> bool:
    """A run folder right inside a sweep's folder (beside its sweep.json)."""
    return (path.parent / SWEEP_FILE).is_file()


def where(path: Path) -> str:
    """The folder holding `path`, relative to the working directory when inside it."""
    parent = path.resolve().parent
    try:
        return str(parent.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(parent)


def labelled(sources: list[data.Source]) -> list[data.Source]:
    """`sources` (one per path: the first wins) named so that no two labels are the same."""
    unique: dict[Path, data.Source] = {}
    for source in sources:
        unique.setdefault(source.path.resolve(), source)
    names = [base_name(s.path) for s in unique.values()]
    out = []
    for source, name in zip(unique.values(), names):
        if names.count(name) > 1:
            name = f"{name} ({where(source.path)})"
        out.append(dataclasses.replace(source, name=name))
    return out


def find(sources: list[data.Source], wanted: str | None) -> data.Source | None:
    """The source a `?run=` link names: by label, else by directory name when only one has it."""
    if not wanted:
        return None
    for source in sources:
        if source.label == wanted:
            return source
    named = [s for s in sources if s.path.name == wanted]
    return named[0] if len(named) == 1 else None


def typed(text: str, preset: str | None) -> list[data.Source]:
    """The sources a typed path opens: a run, a snapshot, a series .pt with a preset, every run in a
    folder of runs, or a training log the run doctor reads (each one in a folder of logs); ValueError
    (one line, shown in the sidebar) for anything else, a log the doctor cannot read included."""
    from models.store.front import MODEL_FILE
    from models.store.series import SERIES_SUFFIXES  # imports torch: only when a path is typed

    path = Path(text).expanduser()
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if logs.history_only(path):  # a log and nothing else: opened where the doctor reads it, refused here if not
        refused = logs.unreadable(path)
        if refused is not None:
            raise ValueError(first_line(refused))
        return [data.Source(path)]
    if is_run_dir(path) or is_snapshot_dir(path) or (path / MODEL_FILE).is_file() or (path / "ckpt.pt").is_file() \
            or logs.foreign_log(path) is not None:  # a log file, a Trainer's output, TensorBoard events:
        return [data.Source(path)]  # what the doctor reads, the app opens
    if is_nanochat(path):  # model_NNNNNN.pt with its meta file: nanochat's, config in the meta
        return [data.Source(path)]
    if path.is_file() and path.suffix in SERIES_SUFFIXES:
        # nanoGPT names its checkpoints ckpt.pt (ckpt_500.pt when saved per step) and they carry
        # their config; any other state dict needs the preset of the model it belongs to
        if not preset and not path.name.startswith("ckpt"):
            raise ValueError(f"{path.name} is a series state dict: type its preset below to open it "
                             "(a nanoGPT ckpt.pt needs none)")
        return [data.Source(path, preset)]
    runs = [data.Source(p) for p in sorted(path.iterdir()) if is_run_dir(p)] if path.is_dir() else []
    if runs:
        return runs
    printed = logs_in(path)  # a folder of printed logs (docs/): each one the doctor reads
    readable = [p for p in printed if logs.unreadable(p) is None]
    if readable:
        return [data.Source(p) for p in readable]
    if printed:
        raise ValueError(f"{path}: no log here that the run doctor reads; {first_line(logs.unreadable(printed[0]))}")
    raise ValueError(f"{path} is not a run, a snapshot, a nanoGPT, nanochat or Hugging Face checkpoint, "
                     "a .pt state dict or a training log (a *.log, *.txt or *.out printed log, "
                     "trainer_state.json, TensorBoard events, a W&B run folder or run-<id>.wandb): nothing to open")


# --------------------------------------------------------------------------- the landing view


def summary(source: data.Source) -> dict[str, Any]:
    """One row of the landing view's table (see `_summary`)."""
    path = source.path
    if is_log_file(path):  # a printed log, trainer_state.json: no model, the doctor's reading
        return {"run": source.label, "model": "-", "steps": None, "snapshots": 0, "last val loss": "-",
                **foreign_row(path)}
    stamp = tuple(p.stat().st_mtime if p.exists() else 0.0
                  for p in (path, path / "metrics.jsonl", path / "run.json"))
    try:
        row = {"run": source.label, **_summary(str(path), stamp, source.preset)}
    except Exception as exc:  # noqa: BLE001 - a garbled run.json or config.json: one row says so
        return {"run": source.label, "model": "-", "steps": None, "snapshots": None, "last val loss": "-",
                "state": f"unreadable: {first_line(exc)}", "doctor": "-"}
    if row.pop("is_run"):
        has_history = (path / "metrics.jsonl").is_file() or logs.foreign_log(path)
        row.update(doctor_columns(path, row["state"]) if has_history else {"doctor": "-"})
        row["state"] = "training now" if run_files.is_training(path) else row["state"]
    elif logs.foreign_log(path) is not None:
        row.update(foreign_row(path))
    return row


def foreign_row(path: Path) -> dict[str, Any]:
    """Steps, state and verdict of a folder holding another trainer's log, from the doctor's
    cached diagnosis (which read that log)."""
    try:
        d = run_files.diagnosis(path)
    except Exception as exc:  # noqa: BLE001 - one row says so; the Overview says why
        return {"state": f"unreadable: {first_line(exc)}", "doctor": "unreadable"}
    return {"steps": d.last_step, "state": f"{'diverged' if doctor_says_diverged(d) else 'logged'} ({d.source})",
            "doctor": d.verdict}


def doctor_says_diverged(d: Any) -> bool:
    """The doctor's failed divergence: a loss gone to 59 is as diverged as a NaN, though every number is finite."""
    return any(f.code == "divergence" and f.severity == "failed" for f in d.findings)


def doctor_columns(path: Path, state: str) -> dict[str, Any]:
    """The doctor's verdict, and "diverged" for a run the files call "logged" whose loss blew up finitely."""
    try:
        d = run_files.diagnosis(path)
    except Exception:  # noqa: BLE001 - one word in the table; the Overview says why
        return {"doctor": "unreadable"}
    return {"doctor": d.verdict, "state": "diverged" if state == "logged" and doctor_says_diverged(d) else state}


@st.cache_data(max_entries=1024, show_spinner=False)  # a long run list must not thrash it
def _summary(path: str, stamp: tuple, preset: str | None = None) -> dict[str, Any]:
    """model, steps, snapshots, last val loss and state (logged / diverged, or what a lone
    checkpoint is) from the files alone: `models.store.peek` reads each format's config unbuilt."""
    from models.store.peek import holds_checkpoint, peek

    where_ = Path(path)
    if not is_run_dir(where_):
        if not holds_checkpoint(where_):
            return {"model": "-", "steps": None, "snapshots": 0, "last val loss": "-",  # another trainer's
                    "state": "training log", "doctor": "-", "is_run": False}  # log alone (foreign_row)
        held = peek(where_, preset)
        return {"model": describe(preset, held["model"]), "steps": held["step"], "snapshots": 1,
                "last val loss": "-", "state": held["format"], "doctor": "-", "is_run": False}
    info = read_run_json(where_) or {}
    snaps = list_snapshots(where_)
    latest = peek(snaps[-1]) if snaps and not info.get("model") else {}
    records = read_metrics(where_)
    losses = [r["val_loss"] for r in records if "val_loss" in r]
    preset = info.get("preset") if info.get("preset") != where_.name else None  # the run's name says it
    return {"model": describe(preset, info.get("model") or latest.get("model") or {}),
            "steps": records[-1]["step"] if records else latest.get("step"), "snapshots": len(snaps),
            "last val loss": shown_loss(losses[-1]) if losses else "-",
            # what the files hold; whether that is healthy is the doctor's word (its own column)
            "state": "diverged" if diverged(records) else "logged" if records else
                     f"{latest['format']}s, no metrics" if snaps and snaps[-1].is_file() else "no metrics yet",
            "is_run": True}


def describe(preset: str | None, model: dict[str, Any]) -> str:
    """`transformer4_rms · 4L×4H d64` from a model config (as run.json or config.json hold it), or
    `transformer 4L×4H d64` with no preset; a model we read but never rebuilt by what builds it and its
    size: `llama 2L×4H d32 · 37.8k params`. Short enough for the run list's column at 1280 px."""
    family = model.get("family", "?")
    shape = f"{model.get('n_layers')}L×{model.get('n_heads')}H d{model.get('d_model')}" \
        if family == "transformer" else f"window {model.get('n_ctx')}"
    if model.get("architecture"):  # a Hugging Face model through the bridge, nanochat's GPT
        size = model.get("n_params")
        return f"{model['architecture']} {shape}" + (f" · {params_text(size)}" if isinstance(size, int) else "")
    if not preset:
        return f"{family} {shape}"
    return f"{preset} · {shape}" if family == "transformer" else f"{preset} · {family} {shape}"  # L×H says transformer


def params_text(n: int) -> str:
    """131,126 -> `131.1k params`, 124,439,808 -> `124.4M params`."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{unit} params"
    return f"{n} params"


def diverged(records: list[dict[str, Any]]) -> bool:
    """A record holds a NaN/inf (a loss, an entropy, a parameter) or says "diverged": the run
    doctor's own test (`probes.doctor.signals.nonfinite_in`)."""
    return any(nonfinite_in(r) for r in records)


def shown_loss(value: Any) -> str:
    """2.847, a blown-up 1.2e+05 (a sweep's too-high rate), or NaN."""
    return loss_text(value) if is_finite(value) else "NaN"
