"""A tuned-lens training epoch against one logit-lens pass over the same tokens, side by side.

    python benchmarks/bench_tuned_lens.py                  # about a minute on 2 CPU cores
    python benchmarks/bench_tuned_lens.py --windows 128 --repeats 5

On the shipped `checkpoints/shakespeare_gpt` (4 layers, d_model 192, 65 characters), `--windows`
random windows of 64 characters from the validation split of its data, in batches of
`--batch-size`. An epoch is one Adam step per batch over all of them (`probes.tuned_lens.fit`:
a frozen hooked forward, each layer's translator and decode, KL to the final layer, backward
into the translators); the logit-lens pass is `probes.logit_lens.run` on the same batches (a
hooked forward, each layer decoded and reduced to its statistics). Both are timed alternately
(median of `--repeats`, after a warm-up of each), so load from other work hits both alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", default=str(ROOT / "checkpoints" / "shakespeare_gpt"), help="run or snapshot")
    parser.add_argument("--windows", type=int, default=64, help="windows in the epoch")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per step / per forward")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)

    import torch

    from models.checkpoint import load_checkpoint
    from probes import logit_lens, tuned_lens
    from probes.common import sample_windows

    if args.threads:
        torch.set_num_threads(args.threads)
    snap = load_checkpoint(args.ckpt)
    corpus = tuned_lens.read_corpus(snap, None)
    n_ctx = int(snap.model.cfg.n_ctx)
    tokens = sample_windows(corpus.val.tolist(), n_ctx, args.windows, seed=1)  # [windows n_ctx]
    batches = list(torch.split(tokens, args.batch_size))

    def epoch() -> None:
        lens = tuned_lens.TunedLens(snap.model)
        tuned_lens.fit(lens, iter(batches), steps=len(batches), progress=False)

    def lens_pass() -> None:
        logit_lens.run(snap.model, batches, k=5, batch_size=args.batch_size, progress=False)

    epoch(), lens_pass()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(args.repeats):
        for fn, out in ((epoch, times[0]), (lens_pass, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    t_epoch, t_lens = statistics.median(times[0]), statistics.median(times[1])
    cfg = snap.model.cfg
    print(f"{snap.name}: {cfg.n_layers} layers, d_model {cfg.d_model}, {len(batches)} batches of "
          f"{args.batch_size}x{n_ctx} tokens ({tokens.numel()} tokens), torch threads {torch.get_num_threads()}")
    print(f"{'':<34}{'time s':>9}{'per 1k tokens ms':>18}")
    for name, t in (("tuned-lens epoch (train)", t_epoch), ("logit-lens pass (inference)", t_lens)):
        print(f"{name:<34}{t:>9.3f}{1000 * t / tokens.numel() * 1000:>18.2f}")
    print(f"ratio epoch / logit-lens pass: {t_epoch / t_lens:.2f}x")


if __name__ == "__main__":
    main()
