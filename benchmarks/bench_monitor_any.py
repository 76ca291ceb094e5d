"""What train.monitor.Monitor costs the loop of a GPT written the way tutorials write it (a model
the store cannot rebuild, so its internals come through the attention tap), in one run.

    python benchmarks/bench_monitor_any.py                          # 100 steps, 9 runs a side, CPU
    python benchmarks/bench_monitor_any.py --steps 20 --repeats 1   # a smoke run

The tutorial GPT of tests/gpt_kit/tutorial.py (one packed qkv, an explicit softmax over
[batch head q k], ReLU MLP, learned positions, (logits, loss) output) at bench_monitor.py's size:
4 layers, 128-d, 4 heads, block 64, batch 16, char-level Tiny Shakespeare, AdamW. The bare loop
against the same loop with the Monitor's three lines at its defaults (a record every 10 steps
with the grad norm and g/w/u of the real update; the internals every 100 through the tap, on 16
held-out windows); the sides alternate in adjacent pairs after one untimed run of each, medians
of wall-clock and CPU time compared. Goal: at most 1.03x. The Monitor's opening (one tapped
forward for run.json's model) and closing are timed apart, and what it does at a log step and
at an eval step is also timed alone and spread over its interval.

A third side saves snapshots of any model at the docs' cadence (`--save-every`, default 100:
the weights, the layout, the patterns and the lens on a sample of the eval tokens,
`train.monitor.save`), against the monitored loop without them: goal at most a few percent;
one save is also timed alone and spread over its interval.
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
    from tests.gpt_kit import BatchedGPT

    torch.manual_seed(0)
    return BatchedGPT(n_layers=LAYERS, n_heads=HEADS, d=D_MODEL, ctx=BLOCK, vocab=vocab)


def one_run(start, x, y, val, save_every: int | None, out: Path) -> Timing:
    """One training run: bare (`save_every` None), monitored, or monitored saving every N steps."""
    import torch

    from train.monitor import Monitor

    model = copy.deepcopy(start)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    t0 = time.perf_counter()
    monitor = None if save_every is None else Monitor(model, optimizer, out, eval_tokens=val, save_every=save_every)
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


def alternate(start, x, y, val, repeats: int, save_every: int) -> dict[str, list[Timing]]:
    sides = {"bare": None, "monitored": 0, "saving": save_every}
    times: dict[str, list[Timing]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats + 1):
            for side in (list(sides) if i % 2 else list(sides)[::-1]):
                timing = one_run(start, x, y, val, sides[side], Path(tmp) / f"{side}{i}")
                if i:  # the first round warms up allocators and imports
                    times[side].append(timing)
    return times


def component_costs(start, x, y, val, repeats: int) -> list[str]:
    """step_costs of the tutorial GPT, its internals read through the tap (as the Monitor does)."""
    import torch

    from train.monitor.tap import measure, plan

    model = copy.deepcopy(start)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tapped = plan(model)
    return step_costs(model, optimizer, lambda: model(x[0], y[0])[1], lambda: measure(tapped, val), repeats,
                      " through the tap")  # the Monitor checks the tap's reading once, at its first forward


def report(times: dict[str, list[Timing]], steps: int, repeats: int, save_every: int) -> list[str]:
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
    for i, clock in ((0, "wall clock"), (1, "CPU time")):
        pairs = statistics.median(s[i] / m[i] for m, s in zip(times["monitored"], times["saving"]))
        lines.append(f"{clock}: monitored + save_every={save_every} {1e3 * median('saving', i) / steps:.2f} ms per "
                     f"step, {median('saving', i) / median('monitored', i):.3f}x the monitored loop "
                     f"(pairs {pairs:.3f}x), {median('saving', i) / median('bare', i):.3f}x the bare one")
    return lines


def save_cost(start, val, save_every: int, step_s: float, repeats: int = 5) -> str:
    """One snapshot of any model, timed alone (wall, median), spread over its interval."""
    import torch

    from train.monitor import Monitor

    with tempfile.TemporaryDirectory() as tmp:
        model = copy.deepcopy(start)
        monitor = Monitor(model, torch.optim.SGD(model.parameters(), lr=0.0), Path(tmp) / "run", eval_tokens=val,
                          save_every=save_every, report=False)
        spent = []
        for i in range(repeats):
            t0 = time.perf_counter()
            saved = monitor.save(i)
            spent.append(time.perf_counter() - t0)
        monitor.close()
        readings = (saved / "readings.safetensors").stat().st_size
    one = statistics.median(spent)
    return (f"alone: one snapshot {one * 1e3:.1f} ms (readings {readings / 1e6:.2f} MB); /{save_every} steps: "
            f"{one / save_every / step_s:.2%} of a step")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="training steps per run (default 100)")
    p.add_argument("--repeats", type=int, default=9, help="timed runs per side, alternated (default 9)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--save-every", type=int, default=100,
                   help="the saving side's save_every (default 100, the docs' cadence)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.save_every < 1:
        p.error("--steps, --repeats and --save-every must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.ERROR)
    x, y, val, vocab = char_batches(args.steps, "cpu")
    start = initial_model(vocab)
    times = alternate(start, x, y, val, args.repeats, args.save_every)
    for line in report(times, args.steps, args.repeats, args.save_every):
        print(line, flush=True)
    print(save_cost(start, val, args.save_every, statistics.median(t[0] for t in times["bare"]) / args.steps))
    for line in component_costs(start, x, y, val, repeats=20) + host_syncs(
            start, x, y, val, "cpu", loss_of=lambda model, xs, ys: model(xs, ys)[1]):
        print(line)


if __name__ == "__main__":
    main()
