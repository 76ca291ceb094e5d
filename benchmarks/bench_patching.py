"""Activation patching against TransformerLens's own loop, side by side in one run.

    python benchmarks/bench_patching.py                 # shakespeare_gpt, 48 tokens, CPU
    python benchmarks/bench_patching.py --device cuda   # on a GPU
    python benchmarks/bench_patching.py --repeats 1     # a smoke run
    python benchmarks/bench_patching.py --threads 1 --clock cpu   # on a machine shared with others

TransformerLens's `get_act_patch_attn_head_out_by_pos` and `get_act_patch_resid_pre` run one
forward per patch (on our model, through a cfg that has the `device` they read); ours runs the
patches as rows of batches from the patched layer's cached activations, only the positions from
the earliest patched one on. Printed: each side's median time, the ratio (goal: >= 5x for heads by
position on CPU), the largest difference as a fraction of the metric's scale (goal: <= 1e-4), and
attribution patching (2 forwards + 1 backward) against TransformerLens's exact loop (goal: >= 100x)
with its correlation with exact patching.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CLEAN = "KING RICHARD III:\nNow is the winter of our disco"  # 48 characters
CORRUPT = CLEAN.replace("RICHARD III", "HENRY THE V")


class TLModel:
    """What transformer_lens.patching reads from a HookedTransformer, handed to our model."""

    def __init__(self, model, device):
        cfg = model.cfg
        self.model = model
        self.cfg = types.SimpleNamespace(device=device, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                                         n_key_value_heads=None)

    def run_with_hooks(self, *args, **kwargs):
        return self.model.run_with_hooks(*args, **kwargs)


def timed(fn, repeats: int, sync, clock=time.perf_counter) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        sync()
        t0 = clock()
        out = fn()
        sync()
        times.append(clock() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", default=str(REPO / "checkpoints" / "shakespeare_gpt"), help="the run to patch")
    parser.add_argument("--device", default="cpu", help="torch device")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per side (median)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall seconds, or this process's CPU seconds (steadier beside other jobs)")
    args = parser.parse_args(argv)

    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformer_lens import patching as tlp
    tlp.tqdm = lambda items, *a, **k: items  # its loop draws a progress bar per sweep: not what is timed

    from models.checkpoint import load_checkpoint
    from probes.patching import run

    snap = load_checkpoint(args.ckpt, device=torch.device(args.device))
    model, tok = snap.model.eval(), snap.tokenizer
    clean, corrupt = (torch.tensor([tok.encode(t)], device=args.device) for t in (CLEAN, CORRUPT))
    assert clean.shape == corrupt.shape == (1, 48), (clean.shape, corrupt.shape)
    answer, wrong = tok.encode("n")[0], tok.encode("r")[0]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    def metric(logits):  # [batch pos vocab] -> []
        return (logits[:, -1, answer] - logits[:, -1, wrong]).mean()

    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
    tl_model = TLModel(model, args.device)
    print(f"{args.ckpt}: {model.cfg.n_layers} layers x {model.cfg.n_heads} heads, {clean.shape[1]} tokens, "
          f"{args.device}, torch threads {torch.get_num_threads()}, {args.clock} clock")
    exact = {}
    for what, tl_fn in (("heads", tlp.get_act_patch_attn_head_out_by_pos), ("resid", tlp.get_act_patch_resid_pre)):
        with torch.no_grad():
            t_tl, ref = timed(lambda: tl_fn(tl_model, corrupt, cache, metric), args.repeats, sync, clock)
        t_ours, ours = timed(lambda: run(model, clean, corrupt, answer=answer, wrong=wrong, what=what),
                             args.repeats, sync, clock)
        exact[what] = (t_tl, ours)
        diff = float((ours.patched.cpu() - ref.cpu()).abs().max()) / float(ref.abs().max())
        print(f"{what:>6} by position: TransformerLens {t_tl * 1e3:8.1f} ms ({ref.numel()} forwards)   "
              f"ours {t_ours * 1e3:7.1f} ms ({ours.forwards} forwards)   ratio {t_tl / t_ours:6.1f}x   "
              f"max diff {diff:.1e} of the metric's scale")
    for star in (False, True):
        t_atp, atp = timed(lambda: run(model, clean, corrupt, answer=answer, wrong=wrong, method="attribution",
                                       atp_star=star), args.repeats, sync, clock)
        t_tl, ours = exact["heads"]
        a, e = atp.patched.flatten().double(), ours.patched.flatten().cpu().double()
        corr = float(torch.corrcoef(torch.stack([a, e]))[0, 1])
        print(f"  heads attribution{'* (AtP*)' if star else '        '}: {t_atp * 1e3:7.1f} ms   against "
              f"TransformerLens's exact loop {t_tl / t_atp:7.1f}x   correlation with exact {corr:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
