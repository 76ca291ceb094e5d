"""What train.monitor.Monitor costs the loop of a GPT written the way tutorials write it (a model
the store cannot rebuild, so its internals come through the attention tap), in one run.

    python benchmarks/bench_monitor_any.py                          # 100 steps, 9 runs a side, CPU
    python benchmarks/bench_monitor_any.py --steps 20 --repeats 1   # a smoke run

The tutorial GPT of tests/any_model_kit.py (one packed qkv, an explicit softmax over
[batch head q k], ReLU MLP, learned positions, (logits, loss) output) at bench_monitor.py's size:
4 layers, 128-d, 4 heads, block 64, batch 16, char-level Tiny Shakespeare, AdamW. The bare loop
against the same loop with the Monitor's three lines at its defaults (a record every 10 steps
with the grad norm and g/w/u of the real update; the internals every 100 through the tap, on 16
held-out windows); the sides alternate in adjacent pairs after one untimed run of each, medians
of wall-clock and CPU time compared. Goal: at most 1.03x. The Monitor's opening (one tapped
forward for run.json's model) and closing are timed apart, and what it does at a log step and
at an eval step is also timed alone and spread over its interval.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

sys.path.insert(0, str(REPO / "tests"))

from bench_monitor import BATCH, BLOCK, D_MODEL, GOAL, HEADS, LAYERS, char_batches, host_syncs, step_costs  # noqa: E402

Timing = tuple[float, float, float]  # (loop wall s, loop CPU s, opening + closing the Monitor wall s)


def initial_model(vocab: int):
    import torch
    from tests.any_model_kit import BatchedGPT

    torch.manual_seed(0)
    return BatchedGPT(n_layers=LAYERS, n_heads=HEADS, d=D_MODEL, ctx=BLOCK, vocab=vocab)


def one_run(start, x, y, val, monitored: bool, out: Path) -> Timing:
    import torch

    from train.monitor import Monitor

    model = copy.deepcopy(start)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    t0 = time.perf_counter()
    monitor = Monitor(model, optimizer, out, eval_tokens=val) if monitored else None
    t1, cpu1 = time.perf_counter(), time.process_time()
    for step in range(len(x)):
        _, loss = model(x[step], y[step])  # the tutorial's (logits, loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = loss.item()
        if monitor is not None:
            monitor.log(step, train_loss=value)
    t2, cpu2 = time.perf_counter(), time.process_time()
    if monitor is not None:
        monitor.close()
    return t2 - t1, cpu2 - cpu1, (t1 - t0) + (time.perf_counter() - t2)


def alternate(start, x, y, val, repeats: int) -> dict[str, list[Timing]]:
    times: dict[str, list[Timing]] = {"bare": [], "monitored": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats + 1):
            for side in (("bare", "monitored") if i % 2 else ("monitored", "bare")):
                timing = one_run(start, x, y, val, side == "monitored", Path(tmp) / f"{side}{i}")
                if i:  # the first round warms up allocators and imports
                    times[side].append(timing)
    return times


def component_costs(start, x, y, val, repeats: int) -> list[str]:
    """step_costs of the tutorial GPT, its internals read through the tap (as the Monitor does)."""
    import torch

    from train.monitor_tap import measure, plan

    model = copy.deepcopy(start)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tapped = plan(model)
    return step_costs(model, optimizer, lambda: model(x[0], y[0])[1], lambda: measure(tapped, val), repeats,
                      " through the tap")  # the Monitor checks the tap's reading once, at its first forward


def report(times: dict[str, list[Timing]], steps: int, repeats: int) -> list[str]:
    import torch

    median = lambda side, i: statistics.median(t[i] for t in times[side])  # noqa: E731
    lines = [f"== tutorial GPT (explicit softmax, packed qkv) {LAYERS} layers x {D_MODEL}-d, {HEADS} heads, block "
             f"{BLOCK}, batch {BATCH}, AdamW; {steps} steps, {repeats} runs a side, cpu, {torch.get_num_threads()} threads",
             "Monitor defaults: a record every 10 steps (grad norm, g/w/u), internals every 100 through the tap",
             f"{'median ms per step':20}{'bare':>9}{'monitored':>11}{'ratio':>9}{'pairs':>9}   (goal <= {GOAL})"]
    for i, clock in ((0, "wall clock"), (1, "CPU time")):
        bare, monitored = median("bare", i), median("monitored", i)
        pairs = statistics.median(m[i] / b[i] for b, m in zip(times["bare"], times["monitored"]))
        lines.append(f"{clock:20}{1e3 * bare / steps:9.2f}{1e3 * monitored / steps:11.2f}"
                     f"{monitored / bare:8.3f}x{pairs:8.3f}x")
    lines.append(f"opening (a tapped forward for run.json) + closing the Monitor: {median('monitored', 2) * 1e3:.1f} ms")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="training steps per run (default 100)")
    p.add_argument("--repeats", type=int, default=9, help="timed runs per side, alternated (default 9)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        p.error("--steps and --repeats must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.ERROR)
    x, y, val, vocab = char_batches(args.steps, "cpu")
    start = initial_model(vocab)
    for line in report(alternate(start, x, y, val, args.repeats), args.steps, args.repeats):
        print(line, flush=True)
    for line in component_costs(start, x, y, val, repeats=20) + host_syncs(
            start, x, y, val, "cpu", loss_of=lambda model, xs, ys: model(xs, ys)[1]):
        print(line)


if __name__ == "__main__":
    main()
