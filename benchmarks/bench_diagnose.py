"""The run doctor, measured side by side in one run.

    python benchmarks/bench_diagnose.py            # transformer4_rms at the series' ctx, batch 64
    python benchmarks/bench_diagnose.py --quick    # transformer4_rms_small, a smoke run

Part two: what the metrics the doctor reads from training cost (attn_logit_max, resid_rms and
logit_max, added to the eval forward that measures attention entropy). The training loop
(`train.loop.run_steps`) runs at the recipe's default intervals (a record every 10 steps, an
eval every 100: `train.args.TRAIN_DEFAULTS`) for one eval cycle at a time, with the metrics
(`train.data.DOCTOR_METRICS` = True) and without them, alternated for several rounds; the
median step time of each side, evals and records included, gives the ratio. Goal: at most 1.03x.
Because one eval in 100 steps hides in the noise of a shared machine, the eval alone is also
timed with and without them (alternated, median) and its difference spread over eval_every steps.

Part one: diagnosing each shipped run (`probes.diagnose.run`), in this process after the import
(median of --diagnose-rounds calls) and in fresh processes, `import probes.diagnose` alone against
the import plus one diagnosis (alternated, median): the doctor's own time beyond its imports.
Goal: under 0.5 s per run, and no torch import (no model is loaded).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = REPO / "data" / "tinyshakespeare.txt"
GOAL = 1.03
DIAGNOSE_GOAL = 0.5  # seconds per shipped run beyond imports


def fresh_process_seconds(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - t0


def bench_diagnose_runs(args: argparse.Namespace) -> list[str]:
    """Part one: each shipped run diagnosed in-process (after import) and in fresh processes."""
    t0 = time.perf_counter()
    from probes import diagnose

    import_s = time.perf_counter() - t0
    runs = sorted(p for p in (REPO / "checkpoints").iterdir() if p.is_dir())
    lines = [f"== diagnosing the shipped runs ({args.diagnose_rounds} calls each, median; "
             f"import probes.diagnose here: {import_s * 1e3:.0f} ms)"]
    for run in runs:
        times = []
        for _ in range(args.diagnose_rounds):
            t0 = time.perf_counter()
            result = diagnose.run(run)
            times.append(time.perf_counter() - t0)
        lines.append(f"{run.name:<24}{statistics.median(times) * 1e3:8.1f} ms  {result.verdict:<8}"
                     f"{len(result.findings)} findings")
    lines.append(f"torch imported by the doctor: {'yes' if 'torch' in sys.modules else 'no'}")
    slowest = max(runs, key=lambda r: (r / "metrics.jsonl").stat().st_size)
    bare = "import probes.diagnose"
    full = f"{bare}; probes.diagnose.run({str(slowest)!r})"
    pairs = [(fresh_process_seconds(bare), fresh_process_seconds(full)) for _ in range(args.process_rounds)]
    base, both = (statistics.median(p[i] for p in pairs) for i in (0, 1))
    lines += [f"fresh process, import alone / import + diagnose {slowest.name}: {base:.3f} / {both:.3f} s",
              f"beyond imports                          {both - base:9.3f} s   (goal < {DIAGNOSE_GOAL} s)"]
    return lines


def training_state(preset: str, batch: int | None, sets: list[str], out: Path, device: str):
    """A fresh TrainState as `python -m train` sets it up, with its Monitor (no lock, no snapshots)."""
    from train.args import build_parser
    from train.config import DistInfo
    from train.records import open_monitor
    from train.start import setup, wrap_model

    argv = ["--preset", preset, "--data", str(DATA), "--out", str(out), "-q", "--no-progress",
            "--device", device, "--steps", "1000000"]
    argv += ["--batch-size", str(batch)] if batch else []
    for item in sets:
        argv += ["--set", item]
    args = build_parser().parse_args(argv)
    args.argv = argv
    out.mkdir(parents=True)
    state = setup(args, DistInfo())
    state.bf16 = state.tc["dtype"] == "bf16"
    state.make_val_blocks()
    wrap_model(state)
    open_monitor(state)  # the trainer's records and eval internals go through it
    return state


def one_cycle(state, doctor: bool) -> float:
    """Seconds per step over the next eval_every steps (records, the eval and its metrics
    included; no snapshot: the end-of-run save is marked done in advance)."""
    from train import data
    from train.loop import run_steps

    data.DOCTOR_METRICS = doctor
    steps = state.tc["eval_every"]
    state.tc["steps"] = state.step + steps
    state.last_saved = state.tc["steps"]
    sync(state)
    t0 = time.perf_counter()
    run_steps(state)
    sync(state)
    return (time.perf_counter() - t0) / steps


def eval_time(state, doctor: bool) -> float:
    """One eval step's work: the val loss and the Monitor's internals on the first batch."""
    from train import data
    from train.monitor.parts import internal_stats

    data.DOCTOR_METRICS = doctor
    sync(state)
    t0 = time.perf_counter()
    data.evaluate(state.raw_model, state.val_blocks, state.tc["batch_size"],
                  state.corpus.chars_per_token, state.autocast)
    internal_stats(state.raw_model, state.monitor.eval_tokens, state.autocast)
    sync(state)
    return time.perf_counter() - t0


def sync(state) -> None:
    import torch

    if state.device.type == "cuda":
        torch.cuda.synchronize(state.device)


def alternate(fn, rounds: int) -> dict[bool, list[float]]:
    """fn(doctor) for doctor off and on, alternated (the order flips each round): drift hits both."""
    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(rounds):
        for doctor in ((False, True) if i % 2 == 0 else (True, False)):
            times[doctor].append(fn(doctor))
    return times


def bench_logging_cost(args: argparse.Namespace) -> list[str]:
    """Part two: step time with the doctor's metrics against without, at default intervals."""
    from train import data

    if not DATA.is_file():
        return [f"skipping the logging cost: {DATA} not found"]
    with tempfile.TemporaryDirectory() as tmp:
        state = training_state(args.preset, args.batch_size, args.set, Path(tmp) / "run", args.device)
        tc = state.tc
        try:
            one_cycle(state, True)  # warm-up: allocator, optimizer state, first eval
            steps = alternate(lambda doctor: one_cycle(state, doctor), args.rounds)
            evals = alternate(lambda doctor: eval_time(state, doctor), args.eval_rounds)
        finally:
            data.DOCTOR_METRICS = True
    off, on = statistics.median(steps[False]), statistics.median(steps[True])
    e_off, e_on = statistics.median(evals[False]), statistics.median(evals[True])
    amortised = 1 + (e_on - e_off) / tc["eval_every"] / off
    cfg = state.cfg
    return [
        f"== logging cost: {args.preset} ({cfg.n_layers} layers x {getattr(cfg, 'n_heads', 0)} heads, "
        f"ctx {cfg.n_ctx}), batch {tc['batch_size']}, {state.device}, log every {tc['log_every']} / "
        f"eval every {tc['eval_every']} steps, {args.rounds} rounds of {tc['eval_every']} steps",
        f"step time without the doctor's metrics  {off * 1e3:9.2f} ms",
        f"step time with them                     {on * 1e3:9.2f} ms",
        f"with / without                          {on / off:9.3f}x   (goal <= {GOAL})",
        f"one eval without / with them            {e_off * 1e3:9.2f} / {e_on * 1e3:.2f} ms "
        f"({args.eval_rounds} rounds)",
        f"eval difference spread over a cycle     {amortised:9.4f}x of a step",
        "rounds, ms/step without: " + " ".join(f"{t * 1e3:.2f}" for t in steps[False]),
        "rounds, ms/step with:    " + " ".join(f"{t * 1e3:.2f}" for t in steps[True]),
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="transformer4_rms_small, 5 rounds (a smoke run)")
    p.add_argument("--preset", default=None,
                   help="model preset (default transformer4_rms; --quick: transformer4_rms_small)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="windows per step (default 64; --quick: the preset's recipe, 32)")
    p.add_argument("--set", action="append", default=[], help="model field override, KEY=VALUE")
    p.add_argument("--rounds", type=int, default=None, help="cycles per side (default 7; --quick 5)")
    p.add_argument("--eval-rounds", type=int, default=None,
                   help="evals per side timed alone (default 60; --quick 30)")
    p.add_argument("--diagnose-rounds", type=int, default=5, help="in-process diagnoses per shipped run")
    p.add_argument("--process-rounds", type=int, default=5, help="fresh-process pairs for the import comparison")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared CPU more threads add spin-wait noise)")
    args = p.parse_args(argv)
    args.preset = args.preset or ("transformer4_rms_small" if args.quick else "transformer4_rms")
    if not args.quick and args.batch_size is None:
        args.batch_size = 64  # the recipe's 4096 windows is a GPU's batch
    args.rounds = args.rounds or (5 if args.quick else 7)
    args.eval_rounds = args.eval_rounds or (30 if args.quick else 60)
    for line in bench_diagnose_runs(args):  # first: before this process imports torch
        print(line, flush=True)
    import torch

    torch.set_num_threads(args.threads)
    for line in bench_logging_cost(args):
        print(line)


if __name__ == "__main__":
    main()
