"""What live g/w/u diagnostics cost, measured side by side in one run.

    python benchmarks/bench_updates.py                  # GPT-2-sized part + training part
    python benchmarks/bench_updates.py --quick          # smaller models, for a smoke run

1. g/w/u of every parameter of a GPT-2-sized model (gpt2_124m: 124M parameters) against one
   AdamW step on it: the snapshot taken before the step plus `gwu_table` after it, compared with
   `optimizer.step()` alone and with a whole training step (forward + backward + step).
   Goal: under 5% of a training step.
2. `python -m train` for the same steps with live diagnostics at the default intervals
   (g/w/u every 10 steps, val loss + entropy + activation health every 100) against the same
   run with records only at the end. Goal: at most 1.05x.

Timings are medians of repeated runs, alternated so that drift hits both sides alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = REPO / "data" / "tinyshakespeare.txt"


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gwu_cost(preset: str, batch: int, ctx: int, repeats: int) -> None:
    import torch

    from models import build_model, get_preset
    from models.loss import lm_loss
    from probes.updates import gwu_table, snapshot_params

    torch.manual_seed(0)
    model = build_model(get_preset(preset, n_ctx=ctx))
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    block = torch.randint(0, model.cfg.d_vocab, (batch, ctx + 1))  # [batch ctx+1]

    def backward() -> None:
        opt.zero_grad(set_to_none=True)
        lm_loss(model, block).backward()

    def train_step() -> None:
        backward()
        opt.step()

    train_step()  # optimizer state exists from here on
    backward()
    t_step = median_time(train_step, repeats)
    backward()
    t_opt = median_time(opt.step, repeats)
    before: dict = {}

    def snapshot() -> None:
        before.update(snapshot_params(model))

    t_snap = median_time(snapshot, repeats)
    opt.step()
    t_table = median_time(lambda: gwu_table(model, before, 1e-4), repeats)
    t_gwu = t_snap + t_table
    print(f"== g/w/u on {preset} ({n_params / 1e6:.1f}M parameters), batch {batch} x ctx {ctx}, "
          f"{torch.get_num_threads()} threads")
    print(f"training step (fwd+bwd+AdamW)  {t_step * 1e3:9.1f} ms")
    print(f"AdamW optimizer.step() alone   {t_opt * 1e3:9.1f} ms")
    print(f"g/w/u: snapshot {t_snap * 1e3:.1f} ms + table {t_table * 1e3:.1f} ms = {t_gwu * 1e3:.1f} ms")
    print(f"g/w/u / training step          {t_gwu / t_step:9.3f}x   (goal < 0.05)")
    print(f"g/w/u / optimizer.step()       {t_gwu / t_opt:9.3f}x")
    print(f"amortised at --log-every 10    {t_gwu / 10 / t_step:9.3f}x of a training step")


def training_cost(preset: str, steps: int, batch: int, repeats: int) -> None:
    from train.loop import main

    if not DATA.is_file():
        print(f"skipping the training part: {DATA} not found")
        return

    def run(*intervals: str):
        def go() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                rc = main(["--preset", preset, "--data", str(DATA), "--out", f"{tmp}/run", "-q",
                           "--steps", str(steps), "--batch-size", str(batch), "--save-every", "0",
                           "--no-progress", *intervals])
                assert rc == 0, rc
        return go

    live = run("--log-every", "10", "--eval-every", "100")  # the defaults
    bare = run("--log-every", str(steps), "--eval-every", str(steps))  # one record, at the end
    times: dict[str, list[float]] = {"live": [], "bare": []}
    for _ in range(repeats):  # alternate, so drift hits both
        for name, fn in (("bare", bare), ("live", live)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    t_live, t_bare = statistics.median(times["live"]), statistics.median(times["bare"])
    print(f"== python -m train --preset {preset}: {steps} steps, batch {batch}")
    print(f"records only at the end        {t_bare:9.2f} s")
    print(f"live diagnostics (defaults)    {t_live:9.2f} s")
    print(f"live / bare                    {t_live / t_bare:9.3f}x   (goal <= 1.05)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small models and few steps (a smoke run)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.quick:
        gwu_cost("tiny_shakespeare_gpt", batch=8, ctx=64, repeats=3)
        training_cost("transformer4_rms_small", steps=100, batch=16, repeats=2)
    else:
        gwu_cost("gpt2_124m", batch=4, ctx=128, repeats=3)
        training_cost("tiny_shakespeare_gpt", steps=200, batch=16, repeats=2)


if __name__ == "__main__":
    main()
