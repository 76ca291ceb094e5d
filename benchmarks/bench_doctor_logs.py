"""What the run doctor costs on long foreign logs (issue 37), against reading the same file plainly,
at two lengths in one run, to show time and memory stay flat per byte read.

    python benchmarks/bench_doctor_logs.py                    # 500,000 and 1,000,000 Trainer entries,
                                                              # 1,000,000 and 2,000,000 nanoGPT lines,
                                                              # 300,000 and 1,000,000 llm.c lines (printed, main.log)
    python benchmarks/bench_doctor_logs.py --scale 0.1        # a tenth of that (a quick look)
    python benchmarks/bench_doctor_logs.py --only llmc        # one kind of file: trainer, nanogpt or llmc

Files: a `trainer_state.json` as transformers' TrainerState.save_to_json writes it (indent 2,
sorted keys; ~103 bytes an entry), a nanoGPT `train.log` of its train.py's lines (an eval line
every 250 iterations), llm.c's printed log of train_gpt2.cu's lines (a set-up table, a val loss
every 250 steps) and its logger's `main.log` (`s:N trl:X lr:Y norm:Z`, a `tel` every 250), each
written to a temporary folder and deleted after. Each measurement runs
in a fresh subprocess; its peak memory is ru_maxrss minus that of a subprocess which only imported
the same modules. Baselines, each in its own subprocess:
- "read": the file's bytes read (f.read in 1 MiB pieces), the floor of any reader;
- "parse": the file read as its format plainly is: json.load for the JSON, the text's lines
  iterated and split for the log.
Doctor: `probes.diagnose.run(None, log=FILE)`, reading and every rule. Goals (issue 37): time within
2x of the plain parse, memory flat in the file's length.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import resource, sys, time, json
sys.path.insert(0, {repo!r})
from probes import diagnose
kind, path = sys.argv[1], sys.argv[2]
start = time.perf_counter()
if kind == "read":
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass
elif kind == "parse-json":
    with open(path, encoding="utf-8") as f:
        json.load(f)
elif kind == "parse-log":
    with open(path, encoding="utf-8") as f:
        for line in f:
            line.split()
elif kind == "doctor":
    d = diagnose.run(None, log=path)
    print(d.verdict, d.last_step, d.source, file=sys.stderr)
elapsed = time.perf_counter() - start
print(json.dumps({{"s": elapsed, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def write_trainer_state(path: Path, entries: int) -> None:
    """TrainerState.save_to_json's layout, written entry by entry (this process stays small)."""
    with path.open("w", encoding="utf-8") as f:
        f.write('{\n  "best_metric": null,\n  "epoch": 3.0,\n  "global_step": %d,\n  "log_history": [\n' % entries)
        for step in range(1, entries + 1):
            loss = 2.0 + 2.2 * math.exp(-step / (entries / 5))
            f.write('    {\n      "epoch": %r,\n      "grad_norm": %r,\n      "learning_rate": 0.0001,\n'
                    '      "loss": %.4f,\n      "step": %d\n    }%s\n'
                    % (round(step / 1000, 3), 1.0 + (step % 7) / 10, loss, step, "," if step < entries else ""))
        f.write('  ],\n  "logging_steps": 1,\n  "max_steps": %d\n}\n' % entries)


def write_nanogpt_log(path: Path, lines: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write(f"max_iters = {lines}\nfound vocab_size = 65 (inside data/shakespeare_char/meta.pkl)\n")
        for it in range(lines):
            loss = 2.0 + 2.2 * math.exp(-it / (lines / 4))
            if it % 250 == 0:
                f.write(f"step {it}: train loss {loss - 0.01:.4f}, val loss {loss + 0.02:.4f}\n")
            f.write(f"iter {it}: loss {loss:.4f}, time {12.5 + (it % 5) / 10:.2f}ms, mfu 5.00%\n")


def write_llmc_log(path: Path, lines: int) -> None:
    """train_gpt2.cu's stdout: its set-up table, then `step k/N | loss ...` lines."""
    with path.open("w", encoding="utf-8") as f:
        f.write("+-----------------------+----------------------------------------------------+\n"
                f"| max_steps             | {lines:<50} |\n| vocab_size V          | {50257:<50} |\n"
                "+-----------------------+----------------------------------------------------+\n")
        for step in range(lines):
            loss = 3.0 + 8.0 * math.exp(-step / (lines / 4))
            if step % 250 == 0:
                f.write(f"val loss {loss + 0.02:f}\n")
            f.write(f"step {step + 1:4d}/{lines} | loss {loss:7.6f} ({(step % 7) / 3 - 1:+.2f}z)| norm "
                    f"{1.0 + (step % 5) / 10:6.4f} ({(step % 3) / 2 - 0.5:+.2f}z)| lr {6e-4 * (1 - step / lines):.2e} | "
                    f"{120.0 + (step % 9):.2f} ms | 40.1% bf16 MFU | 163741 tok/s\n")


def write_main_log(path: Path, lines: int) -> None:
    """llmc/logger.h's main.log: `s:N tel:X` every 250 steps, `s:N trl:X lr:Y norm:Z` every step."""
    with path.open("w", encoding="utf-8") as f:
        for step in range(lines):
            loss = 3.0 + 8.0 * math.exp(-step / (lines / 4))
            if step % 250 == 0:
                f.write(f"s:{step} tel:{loss + 0.02:.4f}\n")
            f.write(f"s:{step} trl:{loss:.4f} lr:{6e-4 * (1 - step / lines):.6f} norm:{1.0 + (step % 5) / 10:.2f}\n")


def measure(kind: str, path: Path) -> dict:
    code = CHILD.format(repo=str(REPO))
    done = subprocess.run([sys.executable, "-c", code, kind, str(path)], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["said"] = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    return result


def row(name: str, path: Path, parse: str, base_rss: float) -> None:
    size = path.stat().st_size / 1e6
    read, plain, doctor = measure("read", path), measure(parse, path), measure("doctor", path)
    mem = doctor["rss_mb"] - base_rss
    print(f"{name:<34} {size:7.1f} MB  read {read['s']:6.2f} s  parse {plain['s']:6.2f} s "
          f"({plain['rss_mb'] - base_rss:6.0f} MB)  doctor {doctor['s']:6.2f} s ({mem:5.0f} MB)  "
          f"doctor/parse {doctor['s'] / plain['s']:4.2f}x  doctor/read {doctor['s'] / read['s']:5.1f}x  "
          f"MB per file MB {mem / size:5.2f}")
    print(f"    doctor said: {doctor['said'][:150]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="file lengths times this")
    parser.add_argument("--only", choices=("trainer", "nanogpt", "llmc"), help="measure one kind of file only")
    args = parser.parse_args()
    entries = [int(n * args.scale) for n in (500_000, 1_000_000)] if args.only in (None, "trainer") else []
    lines = [int(n * args.scale) for n in (1_000_000, 2_000_000)] if args.only in (None, "nanogpt") else []
    llmc = [int(n * args.scale) for n in (300_000, 1_000_000)] if args.only in (None, "llmc") else []
    base_rss = measure("read", Path(__file__))["rss_mb"]  # the interpreter and the doctor's imports
    print(f"python {sys.version.split()[0]}; memory is peak RSS above {base_rss:.0f} MB (imports alone)")
    with tempfile.TemporaryDirectory() as tmp:
        for n in entries:
            path = Path(tmp) / f"s{n}" / "trainer_state.json"
            path.parent.mkdir()
            write_trainer_state(path, n)
            row(f"trainer_state.json, {n:,} entries", path, "parse-json", base_rss)
            path.unlink()
        for n in lines:
            path = Path(tmp) / f"train{n}.log"
            write_nanogpt_log(path, n)
            row(f"nanoGPT log, {n:,} iter lines", path, "parse-log", base_rss)
            path.unlink()
        for n in llmc:
            for name, write in (("train.log", write_llmc_log), ("main.log", write_main_log)):
                path = Path(tmp) / f"llmc{n}" / name
                path.parent.mkdir(exist_ok=True)
                write(path, n)
                row(f"llm.c {'printed log' if name == 'train.log' else 'main.log'}, {n:,} steps", path, "parse-log",
                    base_rss)
                path.unlink()


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"({time.perf_counter() - start:.0f} s in all)")
