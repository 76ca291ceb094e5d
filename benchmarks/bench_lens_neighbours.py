"""Side-by-side timings for the logit lens and the all-vocabulary neighbour search.

    python benchmarks/bench_lens_neighbours.py            # about 1-3 minutes on 2 CPU cores

(a) The logit lens (`probes.logit_lens.run`: one hooked forward, then every layer decoded and
    reduced) against a plain forward of the same model on the same batch, as a ratio.
(b) Every token's top-k neighbours in a random GPT-2-sized 50304 x 768 table: the new search
    (`probes.neighbours.all_neighbours` = `probes.knn.all_knn`: upper-triangle tiles, and a bf16
    first pass with exact rescoring where the CPU multiplies bf16 natively) against the full fp32
    search it replaces (`probes.knn.chunked_search`: every chunk of rows against the whole table),
    on the full table and on a 16384-row slice, where a straightforward full-matrix version
    (`unit @ unit.T`, mask the diagonal, topk; the whole 50304^2 matrix would be ~10 GB) checks
    that both return identical neighbours. Each variant runs in a fresh subprocess so its peak RSS
    (VmHWM) is its own; "extra" is the peak above the peak once the table is built.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probes.knn import chunked_search, use_bf16  # noqa: E402  (torch only: workers stay lean)
from probes.neighbours import all_neighbours  # noqa: E402

VOCAB, D_MODEL, SLICE, K = 50304, 768, 16384, 10


def peak_rss_mb() -> float:
    """Peak RSS of this process's address space. VmHWM, where there is /proc: ru_maxrss survives
    execve on Linux, so a fresh worker would inherit the parent's peak at the moment it forked."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def timed_pair(a, b, repeats: int) -> tuple[float, float]:
    """Median wall times of a() and b(), called alternately (so load changes hit both) after a
    warm-up call of each."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((a, times[0]), (b, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


# ---------------------------------------------------------------- (a) logit lens vs forward

def bench_lens(preset: str, batch: int, repeats: int) -> dict:
    from models import build_model, get_preset
    from probes import logit_lens
    cfg = get_preset(preset)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    tokens = torch.randint(0, cfg.d_vocab, (batch, cfg.n_ctx), generator=torch.Generator().manual_seed(0))

    def forward():
        with torch.inference_mode():
            model(tokens)

    def lens():
        logit_lens.run(model, tokens, k=5, batch_size=batch, progress=False)

    t_forward, t_lens = timed_pair(forward, lens, repeats)
    return {"preset": preset, "batch": f"{batch}x{cfg.n_ctx}", "layers": cfg.n_layers + 1,
            "d_vocab": cfg.d_vocab, "forward_s": t_forward, "lens_s": t_lens, "ratio": t_lens / t_forward}


# ---------------------------------------------------------------- (b) neighbours, one variant per process

def random_table(rows: int) -> torch.Tensor:
    return torch.randn(rows, D_MODEL, generator=torch.Generator().manual_seed(0))


def full_matrix(table: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    unit = table / table.norm(dim=1, keepdim=True)
    sims = unit @ unit.T  # [n n]
    sims.fill_diagonal_(-float("inf"))
    return sims.topk(k, dim=1)


def worker(variant: str, rows: int, out: Path) -> None:
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
    table = random_table(rows)
    baseline = peak_rss_mb()
    start = time.perf_counter()
    search = {"full": full_matrix, "chunked": lambda t, k: chunked_search(t, t, k),
              "new": lambda t, k: all_neighbours(t, k=k)}[variant]
    values, ids = search(table, K)
    elapsed = time.perf_counter() - start
    torch.save({"values": values, "ids": ids}, out)
    print(json.dumps({"time_s": elapsed, "peak_mb": peak_rss_mb(), "extra_mb": peak_rss_mb() - baseline}))


def run_worker(variant: str, rows: int, tmp: Path) -> dict:
    out = tmp / f"{variant}_{rows}.pt"
    proc = subprocess.run([sys.executable, __file__, "--worker", variant, "--rows", str(rows), "--out", str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"worker {variant} {rows} failed:\n{proc.stderr}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "result": torch.load(out, weights_only=True)}


def same_neighbours(a: dict, b: dict) -> str:
    ids_a, ids_b = a["result"]["ids"], b["result"]["ids"]
    rows_differ = int((ids_a != ids_b).any(1).sum())
    max_cos_diff = float((a["result"]["values"] - b["result"]["values"]).abs().max())
    ties = " (only where cosines are exactly equal)" if rows_differ and max_cos_diff == 0 else ""
    return f"identical neighbours: {torch.equal(ids_a, ids_b)} ({rows_differ} rows differ{ties}, " \
           f"max cosine difference {max_cos_diff:.1e})"


def bench_neighbours(tmp: Path) -> None:
    full = run_worker("full", SLICE, tmp)
    pairs = {rows: (run_worker("chunked", rows, tmp), run_worker("new", rows, tmp)) for rows in (SLICE, VOCAB)}
    how = ("bf16 first pass + fp32 rescoring" if use_bf16("auto", torch.zeros(1))
           else "fp32 (this CPU has no native bf16 matmul)")
    print(f"\n(b) all-vocabulary top-{K} cosine neighbours, random table x {D_MODEL}, self excluded; "
          f"new = upper-triangle panels, {how}")
    print(f"{'variant':<34}{'rows':>7}{'time s':>9}{'peak RSS MB':>13}{'extra MB':>10}")
    rows_out = [("full matrix (unit @ unit.T, topk)", SLICE, full)]
    for rows, (old, new) in pairs.items():
        rows_out += [("full fp32 (knn.chunked_search)", rows, old), ("new (all_neighbours)", rows, new)]
    for name, rows, r in rows_out:
        print(f"{name:<34}{rows:>7}{r['time_s']:>9.2f}{r['peak_mb']:>13.0f}{r['extra_mb']:>10.0f}")
    print(f"slice: full fp32 vs full matrix: {same_neighbours(pairs[SLICE][0], full)}")
    print(f"slice: new vs full matrix: {same_neighbours(pairs[SLICE][1], full)}")
    print(f"full table: new vs full fp32: {same_neighbours(pairs[VOCAB][1], pairs[VOCAB][0])}")
    for rows, (old, new) in pairs.items():
        print(f"{rows} rows: full fp32 {old['time_s']:.1f} s / new {new['time_s']:.1f} s = "
              f"{old['time_s'] / new['time_s']:.2f}x; extra memory new {new['extra_mb']:.0f} MB vs "
              f"{old['extra_mb']:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per lens/forward measurement")
    parser.add_argument("--skip-neighbours", action="store_true", help="only run part (a)")
    parser.add_argument("--threads", type=int,
                        help="torch threads here and in the workers (default: torch's default); 1 is "
                             "steadier on a loaded machine, where every multi-threaded op waits at a barrier")
    parser.add_argument("--skip-lens", action="store_true", help="only run part (b)")
    parser.add_argument("--worker", choices=("full", "chunked", "new"), help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=SLICE, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.rows, args.out)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
        os.environ["BENCH_THREADS"] = str(args.threads)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {load}")
    if not args.skip_lens:
        print("\n(a) logit lens (k=5, all layers) vs a plain forward on the same batch, median of "
              f"{args.repeats}")
        print(f"{'preset':<22}{'batch':>8}{'points':>7}{'d_vocab':>8}{'forward s':>11}{'lens s':>9}{'lens/fwd':>9}")
        for preset, batch in (("tiny_shakespeare_gpt", 64), ("transformer4_rms", 64)):
            r = bench_lens(preset, batch, args.repeats)
            print(f"{r['preset']:<22}{r['batch']:>8}{r['layers']:>7}{r['d_vocab']:>8}{r['forward_s']:>11.3f}"
                  f"{r['lens_s']:>9.3f}{r['ratio']:>9.2f}")
    if not args.skip_neighbours:
        with tempfile.TemporaryDirectory() as tmp:
            bench_neighbours(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
