"""What train.monitor.Monitor costs a training loop, measured side by side in one run.

    python benchmarks/bench_monitor.py                           # 100 steps, 9 runs a side, CPU
    python benchmarks/bench_monitor.py --steps 20 --repeats 1    # a smoke run
    python benchmarks/bench_monitor.py --device cuda

nanoGPT's GPT (its own module, tests/nanogpt_ref.py, with its own init) of a size a CPU trains:
4 layers, 128-d, 4 heads, block 64, batch 16, char-level Tiny Shakespeare, AdamW as nanoGPT
sets it. The bare loop (forward, backward, step, the loss read as a float) against the same
loop with the Monitor's three lines at its defaults: a record every 10 steps (the grad norm and
g/w/u of the real update, through the optimizer's step hooks) and the internals every 100 (on
16 held-out windows as eval_tokens). Same initial weights and the same batches for every run;
the sides alternate in adjacent pairs (bare, monitored, monitored, bare, ...) after one
untimed run of each, so drift hits both alike; medians compared (and each pair's ratio), of
wall-clock time and of this process's CPU time (on a shared machine the CPU time is what the
Monitor adds; other processes' load moves the wall clock). Goal: at most 1.03x. Opening and
closing the Monitor (run.json, the lock, the diagnosis printed at the end) happen once per run
and are timed apart. What the Monitor does at a log step and at an eval step is also timed alone
(CPU time; on CUDA wall time between synchronizes) and spread over its interval: the overhead the
runs should show, read without the noise of whole runs. Last, the host syncs it adds per record
step and per eval step (goal <= 2 and <= 3): counted on the CPU by tests/sync_count.py (what
would sync on a GPU), on CUDA by torch.cuda.set_sync_debug_mode.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
DATA = REPO / "data" / "tinyshakespeare.txt"
GOAL = 1.03
LAYERS, D_MODEL, HEADS, BLOCK, BATCH = 4, 128, 4, 64, 16


def char_batches(steps: int, device: str):
    """`steps` training windows [BATCH BLOCK] with their targets, and BATCH held-out windows."""
    import torch

    text = DATA.read_text(encoding="utf-8")
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text[:200_000]])  # [chars]
    split = len(ids) * 9 // 10
    g = torch.Generator().manual_seed(0)
    starts = torch.randint(split - BLOCK - 1, (steps, BATCH), generator=g)
    x = torch.stack([torch.stack([ids[s:s + BLOCK] for s in row]) for row in starts])  # [steps batch block]
    y = torch.stack([torch.stack([ids[s + 1:s + BLOCK + 1] for s in row]) for row in starts])
    val_starts = torch.randint(split, len(ids) - BLOCK, (BATCH,), generator=g)
    val = torch.stack([ids[s:s + BLOCK] for s in val_starts])  # [batch block]
    return x.to(device), y.to(device), val.to(device), len(chars)


def initial_model(vocab: int, device: str):
    import torch
    from nanogpt_ref import GPT, GPTConfig, init_like_nanogpt

    torch.manual_seed(0)
    config = GPTConfig(block_size=BLOCK, vocab_size=vocab, n_layer=LAYERS, n_head=HEADS, n_embd=D_MODEL)
    return init_like_nanogpt(GPT(config)).to(device)


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


Timing = tuple[float, float, float, float]  # (loop wall s, loop CPU s, opening + closing wall s, slowest log() wall s)


def one_run(start, x, y, val, device: str, monitored: bool, out: Path) -> Timing:
    """How long one training run took: its loop (wall clock and CPU) and the Monitor's open + close."""
    import torch
    import torch.nn.functional as F

    from train.monitor import Monitor

    model = copy.deepcopy(start)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    t0 = time.perf_counter()
    monitor = Monitor(model, optimizer, out, eval_tokens=val) if monitored else None
    sync(device)
    t1, cpu1 = time.perf_counter(), time.process_time()
    slowest = 0.0
    for step in range(len(x)):
        logits = model(x[step])  # [batch block vocab]
        loss = F.cross_entropy(logits.flatten(0, 1), y[step].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()  # both sides read it, as a loop that prints its loss does
        if monitor is not None:
            t_log = time.perf_counter()
            monitor.log(step, train_loss=value)
            slowest = max(slowest, time.perf_counter() - t_log)
    sync(device)
    t2, cpu2 = time.perf_counter(), time.process_time()
    if monitor is not None:
        monitor.close()
    t3 = time.perf_counter()
    return t2 - t1, cpu2 - cpu1, (t1 - t0) + (t3 - t2), slowest


def alternate(start, x, y, val, device: str, repeats: int) -> dict[str, list[Timing]]:
    """repeats runs of each side in adjacent pairs (the order flips each round), after one
    untimed run of each (the monitored one kept as "cold": this process's first, imports and all)."""
    times: dict[str, list[Timing]] = {"bare": [], "monitored": [], "cold": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats + 1):
            for side in (("bare", "monitored") if i % 2 else ("monitored", "bare")):
                timing = one_run(start, x, y, val, device, side == "monitored", Path(tmp) / f"{side}{i}")
                if i:  # the first round warms allocators, thread pools and the imports up
                    times[side].append(timing)
                elif side == "monitored":
                    times["cold"].append(timing)
    return times


def median_seconds(fn, repeats: int, device: str = "cpu") -> float:
    """Median seconds of fn() over `repeats` calls: this process's CPU time on the CPU; on CUDA
    wall time between two `torch.cuda.synchronize()`, so the kernels fn queued are counted."""
    import torch

    cuda = device == "cuda"
    clock = time.perf_counter if cuda else time.process_time
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = clock()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(clock() - t0)
    return statistics.median(times)


def step_costs(model, optimizer, loss_of, eval_internals, repeats: int, eval_words: str = "",
               device: str = "cpu") -> list[str]:
    """What the Monitor does at a log step (grad norm + g/w/u, read on the host) and at an eval
    step (`eval_internals()`, a HostCopy, read), each timed alone (`median_seconds`) against a
    training step of `model` (`loss_of()` its loss), spread over its interval: the overhead the
    side-by-side runs should show."""
    from probes.updates import snapshot_params
    from train.monitor.parts import grad_squares, update_readings

    def train_step() -> None:
        loss_of().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # the grads stay for the measurements below

    def log_step() -> None:
        before, squares = snapshot_params(model), grad_squares(model)
        update_readings(model, before, squares, 1e-3).get()

    train_step()
    step_s = median_seconds(train_step, repeats, device)
    log_s = median_seconds(log_step, repeats, device)
    eval_s = median_seconds(lambda: eval_internals().get(), repeats, device)
    expected = 1 + (log_s / 10 + eval_s / 100) / step_s
    clock = "wall ms, synchronized" if device == "cuda" else "CPU ms"
    return [f"alone, {clock}: a training step {step_s * 1e3:.1f}; a log step's grad norm + g/w/u "
            f"{log_s * 1e3:.2f} (/10 steps: {log_s / 10 / step_s:.2%} of a step); an eval step's "
            f"internals{eval_words} {eval_s * 1e3:.1f} (/100 steps: {eval_s / 100 / step_s:.2%})",
            f"expected monitored / bare from these   {expected:.3f}x"]


def component_costs(start, x, y, val, repeats: int, device: str = "cpu") -> list[str]:
    """step_costs of nanoGPT's GPT, its internals read through our hooked twin (as the Monitor does)."""
    import torch
    import torch.nn.functional as F

    from models.store.live import twin_config
    from train.monitor.parts import EvalReadings

    model = copy.deepcopy(start)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    internals = EvalReadings(model, twin_config(model), val, None, nullcontext)
    return step_costs(model, optimizer, lambda: F.cross_entropy(model(x[0]).flatten(0, 1), y[0].flatten()),
                      internals.measure, repeats, device=device)


def host_syncs(start, x, y, val, device: str, loss_of=None) -> list[str]:
    """Host syncs the Monitor adds per record step and per eval step: a monitored run of 8 steps
    (a record every 2, internals every 4) against the same bare run, step by step. On the CPU
    they are counted by tests/sync_count.py (what would sync on a GPU); on CUDA by
    `torch.cuda.set_sync_debug_mode("warn")`, one warning per synchronizing call."""
    import torch
    import torch.nn.functional as F

    from train.monitor import Monitor

    loss_of = loss_of or (lambda model, xs, ys: F.cross_entropy(model(xs).flatten(0, 1), ys.flatten()))

    def per_step(monitored: bool, out: Path) -> list[int]:
        from sync_count import syncs_per_step
        model = copy.deepcopy(start)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        monitor = Monitor(model, optimizer, out, log_every=2, eval_every=4, eval_tokens=val,
                          report=False) if monitored else None
        batches = list(zip(x[:8], y[:8]))
        return syncs_per_step(model, optimizer, batches, lambda batch: loss_of(model, *batch), monitor,
                              lambda: counting(device))[:-1]

    with tempfile.TemporaryDirectory() as tmp:
        extra = [m - b for b, m in zip(per_step(False, Path(tmp) / "bare"), per_step(True, Path(tmp) / "monitored"))]
    records = [n for step, n in enumerate(extra) if step % 2 == 0 and step % 4]
    evals = [n for step, n in enumerate(extra) if step % 4 == 0]
    how = "torch.cuda.set_sync_debug_mode" if device == "cuda" else "tests/sync_count.py"
    return [f"host syncs the Monitor adds ({how}): per record step {max(records)}, per eval step {max(evals)}, "
            f"other steps {max(n for step, n in enumerate(extra) if step % 2)} (goal <= 2, <= 3, 0)"]


@contextmanager
def counting(device: str):
    """Yields a function giving the host syncs made inside the block so far."""
    if device != "cuda":
        from sync_count import host_syncs
        with host_syncs() as count:
            yield count
        return
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield lambda: sum("synchroniz" in str(w.message) for w in caught)
        finally:
            torch.cuda.set_sync_debug_mode(0)


def spread(ratios: list[float]) -> str:
    """min, quartiles and max of the pair ratios: how far one round's answer can be from another's."""
    if len(ratios) < 2:
        return f"one pair ({ratios[0]:.3f}x): no spread to tell"
    q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return (f"min {min(ratios):.3f}x, quartiles {q1:.3f}x / {q2:.3f}x / {q3:.3f}x, max {max(ratios):.3f}x "
            f"over {len(ratios)} pairs")


def report(times: dict[str, list[Timing]], steps: int, args: argparse.Namespace) -> list[str]:
    import torch

    median = lambda side, i: statistics.median(t[i] for t in times[side])  # noqa: E731
    lines = [
        f"== nanoGPT GPT {LAYERS} layers x {D_MODEL}-d, {HEADS} heads, block {BLOCK}, batch {BATCH}, AdamW; "
        f"{steps} steps, {args.repeats} runs a side, {args.device}"
        + (f", {torch.get_num_threads()} threads" if args.device == "cpu" else ""),
        "Monitor defaults: a record every 10 steps (grad norm, g/w/u), internals every 100 (eval_tokens 16 x 64)",
        f"{'median ms per step':20}{'bare':>9}{'monitored':>11}{'ratio':>9}{'pairs':>9}   (goal <= {GOAL})"]
    for i, clock in ((0, "wall clock"), (1, "CPU time")):
        bare, monitored = median("bare", i), median("monitored", i)
        pairs = statistics.median(m[i] / b[i] for b, m in zip(times["bare"], times["monitored"]))
        lines.append(f"{clock:20}{1e3 * bare / steps:9.2f}{1e3 * monitored / steps:11.2f}"
                     f"{monitored / bare:8.3f}x{pairs:8.3f}x")
    lines.append("(ratio: of the medians; pairs: the median ratio of runs taken one after the other)")
    for i, clock in ((0, "wall clock"), (1, "CPU time")):
        lines.append(f"the pairs' spread, {clock}: " + spread([m[i] / b[i] for b, m in zip(times["bare"], times["monitored"])]))
    lines.append(f"opening + closing the Monitor: {median('monitored', 2) * 1e3:.1f} ms once per run "
                 "(with the closing diagnosis)")
    cold = times["cold"][0]
    lines.append(f"the slowest log() call, wall: {median('monitored', 3) * 1e3:.1f} ms in a timed run; "
                 f"{cold[3] * 1e3:.1f} ms in this process's first run (opening it: {cold[2] * 1e3:.0f} ms, "
                 "where the hooked twin is built and its imports made, off the loop's steps)")
    for side in ("bare", "monitored"):
        lines.append(f"runs, wall / CPU s, {side + ':':11}" + " ".join(f"{w:.2f}/{c:.2f}" for w, c, *_ in times[side]))
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100,
                   help="training steps per run (default 100: one eval cycle, 10 records and 1 eval)")
    p.add_argument("--repeats", type=int, default=9, help="timed runs per side, alternated (default 9)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train (default cpu)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a shared CPU more threads add spin-wait noise)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        p.error("--steps and --repeats must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.ERROR)  # the closing diagnosis is timed, not shown
    x, y, val, vocab = char_batches(args.steps, args.device)
    start = initial_model(vocab, args.device)
    for line in report(alternate(start, x, y, val, args.device, args.repeats), args.steps, args):
        print(line, flush=True)
    for line in component_costs(start, x, y, val, 20, args.device) + host_syncs(start, x, y, val, args.device):
        print(line)


if __name__ == "__main__":
    main()
