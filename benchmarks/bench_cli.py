"""How fast the CLIs answer, measured side by side in one run (fresh subprocesses).

    python benchmarks/bench_cli.py               # 5 runs per command
    python benchmarks/bench_cli.py --repeats 2   # a smoke run

1. `python -m X --help` for every CLI against a bare `python -c pass` and against
   `python -c "import torch, transformer_lens"`. Goal: --help under 0.3 s, a small fraction of
   the import.
2. One probe on a short text of a shipped run (`probes.entropy --ckpt checkpoints/shakespeare_rms4
   --text ...`) against `python -c "import torch, transformer_lens"` alone: the ratio shows
   whether the probe is dominated by import time (goal: close to 1).

Timings are medians of repeated runs, alternated so that drift hits every command alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLIS = ("probes.entropy", "probes.degenerate", "probes.neighbours", "probes.logit_lens",
        "probes.updates", "probes.activations", "probes.patching", "probes.ablate", "models.info",
        "models.sample", "train")
BARE = [sys.executable, "-c", "pass"]
IMPORTS = [sys.executable, "-c", "import torch, transformer_lens"]
PROBE = [sys.executable, "-m", "probes.entropy", "--ckpt", "checkpoints/shakespeare_rms4",
         "--text", "ROMEO: But soft, what light through yonder window breaks?", "--device", "cpu"]


def run_once(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    return elapsed


def medians(commands: dict[str, list[str]], repeats: int) -> dict[str, float]:
    """Median wall time of each command, the commands alternated within every round."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, cmd in commands.items():
            times[name].append(run_once(cmd))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs per command (default 5)")
    args = p.parse_args()
    commands = {"python -c pass": BARE, "import torch, transformer_lens": IMPORTS,
                **{f"{m} --help": [sys.executable, "-m", m, "--help"] for m in CLIS},
                "probes.entropy on a short text": PROBE}
    t = medians(commands, args.repeats)
    bare, imports = t["python -c pass"], t["import torch, transformer_lens"]
    print(f"== medians of {args.repeats} fresh processes each ({sys.executable})")
    print(f"python -c pass                       {bare:7.3f} s")
    print(f"import torch, transformer_lens       {imports:7.3f} s")
    print(f"{'command':<36} {'seconds':>7} {'/ bare':>8} {'/ imports':>10}")
    for m in CLIS:
        s = t[f"{m} --help"]
        print(f"{m + ' --help':<36} {s:7.3f} {s / bare:8.2f}x {s / imports:9.3f}x   (goal < 0.3 s)")
    probe = t["probes.entropy on a short text"]
    print(f"probes.entropy on a short text       {probe:7.3f} s   / imports {probe / imports:.2f}x   "
          "(goal: close to 1, the probe is the import plus little)")


if __name__ == "__main__":
    main()
