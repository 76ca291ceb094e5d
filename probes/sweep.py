"""A learning-rate sweep read back: the table (rate x variant: final val loss, where it diverged,
the doctor's verdict) and each variant's LR sensitivity and widest stable range.

    python -m probes.sweep --ckpt sweeps/qk
    python -m probes.sweep --ckpt sweeps/qk --json

    from probes import sweep
    s = sweep.run("sweeps/qk")
    s.variants[0]["lr_sensitivity"], s.cell(1e-2, "qk_norm=rms")["verdict"]

Torch-free like the doctor: it reads SWEEP_DIR/sweep.json (written by `python -m train.sweep`)
and, for runs still training, how far their metrics.jsonl got. The numbers are defined in
`probes.sweep_parts.stats`.
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on (see models.interrupts)
    from models.interrupts import quiet_signals
    quiet_signals()

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.cli import Parser, add_json_argument, path_text
from models.store.files import CheckpointError, read_json_object
from models.store.run import read_metrics, read_run_json
from probes.cli import Shown, json_document, run_probe
from probes.sweep_parts.file import check_sweep
from probes.sweep_parts.stats import SWEEP_FILE

__all__ = ["SweepResult", "build_parser", "main", "rate_text", "run"]

CELL = 29  # characters per variant in the table
STABLE_NOTE = ("stable rates: consecutive rates whose runs the doctor calls healthy or warning; a divergence "
               "or a failed run ends the range. A diverged run has no final loss ('-').")


def rate_text(rate: float) -> str:
    return f"{rate:.0e}" if float(f"{rate:.0e}") == rate else f"{rate:.3g}"


@dataclass
class SweepResult:
    """sweep.json of one sweep, with the progress of runs still training read from their files."""

    path: str
    data: dict[str, Any]

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.data["runs"]

    @property
    def variants(self) -> list[dict[str, Any]]:
        return self.data.get("variants", [])

    @property
    def rates(self) -> list[float]:
        return list(self.data["grid"]["rates"])

    def cell(self, lr: float, variant: str) -> dict[str, Any] | None:
        return next((r for r in self.runs if r["lr"] == lr and r["variant"] == variant), None)

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": self.path, **self.data}

    def format(self) -> str:
        return "\n".join([self.headline(), "", *self.table(), "", *self.summary(), "", STABLE_NOTE])

    def headline(self) -> str:
        grid, runs = self.data["grid"], self.runs
        done = sum(r["status"] == "finished" for r in runs)
        failed = sum(r["status"] == "failed" for r in runs)
        return (f"{self.path}: {grid['preset']}, {len(self.rates)} rates x {len(self.variants)} variant(s), "
                f"{done} of {len(runs)} runs finished" + (f", {failed} failed" if failed else "")
                + f"; sweep {self.data.get('status', '?')}")

    def table(self) -> list[str]:
        """One row per rate; per variant its final val loss, divergence step and verdict."""
        names = [v["name"] for v in self.variants]
        head = f"{'final':>7}  {'diverged':<10} {'verdict'}"
        rows = [("", [n[:CELL] for n in names]), ("lr", [head] * len(names))]
        rows += [(rate_text(lr), [cell_text(self.cell(lr, n)) for n in names]) for lr in self.rates]
        return [(f"{first:8}" + "".join(f"  {c:<{CELL}}" for c in cells)).rstrip() for first, cells in rows]

    def summary(self) -> list[str]:
        lines = [f"{'variant':<24} {'LR sensitivity':<20} {'stable rates':<34} best"]  # see STABLE_NOTE
        for v in self.variants:
            sens = "-" if v.get("lr_sensitivity") is None else f"{v['lr_sensitivity']:.3f}"
            if not v.get("complete"):
                sens += f" ({v['finished']} of {v['runs']})"
            best = "-" if v.get("best_lr") is None else f"{v['best_val_loss']:.3f} at lr {rate_text(v['best_lr'])}"
            lines.append(f"{v['name']:<24} {sens:<20} {range_text(v.get('stable_range')):<34} {best}".rstrip())
        return lines


def cell_text(run: dict[str, Any] | None) -> str:
    """'  3.738  -          healthy', or what the run is doing instead (running, failed...)."""
    if run is None:
        return "-"
    status = run["status"]
    if status == "running" and run.get("last_step") is not None:
        return f"running, step {run['last_step']}/{run.get('steps', '?')}"
    if status != "finished":
        return status + (f" (exit {run['exit_code']})" if run.get("exit_code") is not None else "")
    diverged = "-" if run.get("diverged_at") is None else f"step {run['diverged_at']}"
    final = "-" if run.get("final_val_loss") is None or diverged != "-" else loss_text(run["final_val_loss"])
    return f"{final:>7}  {diverged:<10} {run.get('verdict') or '-'}"


def loss_text(loss: float) -> str:
    """Three decimals in the column's 7 characters; a blown-up loss (535.851, 116104) as 5.4e+02."""
    return f"{loss:.3f}" if abs(loss) < 100 else f"{loss:.1e}"


def range_text(rng: dict[str, Any] | None) -> str:
    if not rng:
        return "none (every rate diverged)"
    if rng["lo"] == rng["hi"]:
        return f"{rate_text(rng['lo'])} only"
    return f"{rate_text(rng['lo'])}..{rate_text(rng['hi'])} ({rng['decades']:.1f} decades)"


def run(sweep_dir: str | Path) -> SweepResult:
    """Read a sweep folder; ValueError (one line) for a folder that holds no sweep."""
    folder = Path(sweep_dir)
    path = folder / SWEEP_FILE
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder")
    if not path.is_file():
        raise ValueError(f"{folder} is no sweep: it holds no {SWEEP_FILE} (python -m train.sweep writes one)")
    data = check_sweep(read_json_object(path), path)
    for entry in data["runs"]:
        if entry.get("status") == "running":
            entry.update(progress(folder / entry["dir"]))
    return SweepResult(str(sweep_dir), data)


def progress(run_dir: Path) -> dict[str, Any]:
    """How far a run still training got: its last logged step and its planned steps."""
    try:
        records = read_metrics(run_dir)
        steps = ((read_run_json(run_dir) or {}).get("train") or {}).get("steps")
    except CheckpointError:
        return {}
    return {"last_step": records[-1]["step"] if records else None, "steps": steps}


def build_parser() -> Parser:
    p = Parser(prog="python -m probes.sweep",
               description="A learning-rate sweep (python -m train.sweep) read back: final val loss, "
                           "divergence step and the doctor's verdict per rate and variant, then each "
                           "variant's LR sensitivity (Wortsman et al. 2023) and widest stable range.",
               epilog="examples:\n  python -m probes.sweep --ckpt sweeps/qk\n"
                      "  python -m probes.sweep --ckpt sweeps/qk --json\n")
    p.add_argument("--ckpt", type=path_text, required=True, metavar="SWEEP_DIR",
                   help="the sweep's folder (holding sweep.json)")
    add_json_argument(p)
    return p


def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, lambda args: Shown.of(run(args.ckpt), as_json=json_document))


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
