"""The trouble table: kinds of trouble x ways of meeting them (the guard, `train.guard`, and
others' rules), side by side in one run.

    python benchmarks/bench_guard.py                  # the report: seeds 0, 1; ~12 min on 2 idle cores
    python benchmarks/bench_guard.py --dev            # the development seeds (100, 101) the guard is tuned on
    python benchmarks/bench_guard.py --quick          # a smoke run: 40 steps, one seed, no timing (~2 min)
    python benchmarks/bench_guard.py --dev --kinds garbage,shift --try patience=3   # one setting on some kinds

The cases (benchmarks/guard_cases.py): a small GPT of ours on Tiny Shakespeare's characters, 300
steps, in four recipes (AdamW with warmup and cosine, AdamW at a constant rate, SGD with momentum,
Adam under OneCycleLR), each at its good rate (healthy) and at 10x, 100x and 1000x it (blowup);
AdamW at a constant 30x (stall); the good AdamW run with 5 garbage batches at mid-run (random
tokens; shuffled labels), with its text upper-cased from mid-run (shift), with its rate x20 for 3
steps at mid-run (transient); a transformers GPT-2 in a Trainer at 0.1 (hf, benchmarks/guard_hf.py).
The arms (benchmarks/guard_arms.py): none, PaLM's rewind-and-skip made automatic, OLMo-core's
skip-step, Lightning's SpikeDetection (it stops the run), the guard at its defaults.

Per kind and arm it prints how many runs met the kind's goal and the mean final val loss (64 fixed
held-out windows; a run that ended non-finite or above its initial loss counts as that initial
loss) above the run it is measured against, then the stops, the false stops (runs
stopped that would have ended within 0.5 nats of their reference unwatched), the guard's goals, and
every run. The references, per seed: a blow-up or stall against its recipe's healthy run (the
best), garbage and transient against the clean run, a shift against itself unwatched. Then the
guard's cost on a healthy run: the Monitor alone against the Monitor with the guard (--attach: the
bare loop against Guard.attach), in adjacent pairs after one untimed run of each, medians of
wall-clock and CPU time (goal <= 1.05x), the final weights compared bitwise with the bare loop's.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from guard_arms import ARMS  # noqa: E402
from guard_cases import GOOD, KINDS, Case, Outcome, cases, ids  # noqa: E402
from guard_hf import HF_ARMS  # noqa: E402
from guard_loop import train  # noqa: E402

SEEDS, DEV_SEEDS = (0, 1), (100, 101)
GOAL_COST = 1.05
GOALS = {  # kind -> what a run must do (said in the table)
    "healthy": "bitwise the unwatched run",
    "blowup": "<= best + 0.5",
    "stall": "<= best + 0.5",
    "garbage": "<= clean + 0.05, <= none + 0.01",
    "shift": "no stop, <= none + 0.05",
    "transient": "no stop, <= none + 0.05",
    "offlog": "<= clean + 0.5",
    "llama": "healthy bitwise; <= best + 0.5",
    "phase": "bitwise the unwatched run",
    "hf": "<= best + 0.5",
}


def run_all(kinds: tuple[str, ...], arms: tuple[str, ...], seeds: tuple[int, ...], steps: int, workers: int,
            options: dict | None = None, references: bool = True) -> list[Outcome]:
    """Every (case, arm, seed) of `kinds`, plus (`references`) the unwatched runs they are measured against."""
    ids(), ids(upper=True)  # read once, before the workers fork
    import train.guard.run  # noqa: F401 (imported before the fork: every run runs the same code)
    chosen = [c for c in cases() if c.kind in kinds]
    needed = {c.reference() for c in chosen} - set(chosen) if references else set()
    jobs = []
    for seed in seeds:
        for case in chosen:
            for arm in arms:
                if case.family != "hf" or arm in HF_ARMS:
                    jobs.append((case, arm, seed, steps, options if arm == "guard" else None))
        jobs += [(case, "none", seed, steps, None) for case in needed]
    jobs.sort(key=lambda j: j[0].family != "hf")  # the slowest first: the pool ends together
    if workers <= 1:
        return [_one(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("fork")) as pool:
        return list(pool.map(_one, jobs))


def _one(job: tuple) -> Outcome:
    for name in ("train", "transformers"):  # a line per rescue or Trainer step: counted here instead
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return train(*job)


def final(r: Outcome) -> float:
    """The final val loss, no higher than the initial one: a run that ended non-finite or worse than
    it started counts as its initial loss (as Wortsman et al.'s LR sensitivity counts it)."""
    return min(r.final_val, r.init_val) if math.isfinite(r.final_val) else r.init_val


class Book:
    """The runs by (case, arm, seed), and each run's reference and unwatched twin."""

    def __init__(self, runs: list[Outcome]):
        self.runs = {(r.case, r.arm, r.seed): r for r in runs}

    def ref(self, r: Outcome) -> Outcome:
        return self.runs[(r.case.reference(), "none", r.seed)]

    def bare(self, r: Outcome) -> Outcome:
        return self.runs[(r.case, "none", r.seed)]

    def ok(self, r: Outcome) -> bool:
        """Whether run `r` met its kind's goal (GOALS)."""
        kind, value, ref, bare = r.case.kind, final(r), final(self.ref(r)), final(self.bare(r))
        finite = math.isfinite(r.final_val)
        if kind in ("healthy", "phase") or kind == "llama" and r.case == r.case.reference():
            return r.weights == self.bare(r).weights
        if kind == "llama" and r.case.event:
            return finite and value <= ref + 0.05 and value <= bare + 0.01
        if kind in ("blowup", "stall", "hf", "offlog", "llama"):
            return finite and value <= ref + 0.5
        if kind == "garbage":
            return finite and value <= ref + 0.05 and value <= bare + 0.01
        return finite and not r.stopped and value <= bare + 0.05  # shift, transient

    def false_stop(self, r: Outcome) -> bool:
        """Stopped a run that, unwatched, ended within 0.5 nats of its reference (or is healthy data)."""
        return r.stopped and (r.case.kind in ("healthy", "phase", "garbage", "shift", "transient")
                              or final(self.bare(r)) <= final(self.ref(r)) + 0.5)

    def of(self, kind: str, arm: str) -> list[Outcome]:
        return [r for (c, a, _), r in sorted(self.runs.items(), key=lambda kv: (kv[0][0].name, kv[0][2]))
                if c.kind == kind and a == arm]


def table(book: Book, kinds: tuple[str, ...], arms: tuple[str, ...]) -> list[str]:
    """Per kind and arm: runs that met the goal, and the mean final val loss above the reference."""
    width = 16
    lines = [f"{'kind':<10} {'goal':<31} " + "".join(f"{a:>{width}}" for a in arms)]
    for kind in kinds:
        cells = []
        for arm in arms:
            mine = book.of(kind, arm)
            if not mine:
                cells.append(f"{'-':>{width}}")
                continue
            above = statistics.fmean(final(r) - final(book.ref(r)) for r in mine)
            cells.append(f"{sum(map(book.ok, mine))}/{len(mine)} {above:+.3f}".rjust(width))
        lines.append(f"{kind:<10} {GOALS[kind]:<31} " + "".join(cells))
    for label, count in (("stops", lambda r: r.stopped), ("false stops", book.false_stop), ("errors", lambda r: bool(r.error)),
                         ("actions", lambda r: r.rescues), ("batches lost", lambda r: r.lost)):
        row = [sum(count(r) for k in kinds for r in book.of(k, a)) for a in arms]
        lines.append(f"{label:<42} " + "".join(f"{v:>{width}}" for v in row))
    return lines


STORY_CAUSE = {"data_spike": "bad batches", "rate_blowup": "too large", "stall": "stopped coming back"}


def doctor_right(r: Outcome) -> bool:
    """Whether the doctor tells each rescue of guarded run `r` right: one story per rescue, a cause in
    its kind's words, and advice to match: the data at the steps skipped for bad batches; for a rate,
    none or a peak rate below the one the run was given (never the rate it was rescued from)."""
    if len(r.stories) < r.rescues:
        return False
    for kind, _, cause, fix in r.stories:
        if STORY_CAUSE.get(kind, "?") not in cause:
            return False
        if kind == "data_spike":
            if not fix.startswith("check the data at steps"):
                return False
        elif "none for the rate" not in fix:
            advised = re.search(r"lower the peak learning rate to about ([0-9.e+-]+)", fix)
            if advised is None or not float(advised.group(1)) < r.case.lr:
                return False
    return True


def guard_goals(book: Book, kinds: tuple[str, ...]) -> list[str]:
    """The issue's goals for the guard, each met or missed."""
    lines = []
    for kind, goal, need in (("blowup", "blow-ups within 0.5 nats of the best", 0.9),
                             ("garbage", "garbage within 0.05 of clean, no worse than unguarded", 1.0),
                             ("shift", "a healthy shift never stopped, <= unguarded + 0.05", 1.0),
                             ("healthy", "healthy runs bitwise untouched", 1.0),
                             ("phase", "phase changes at three rates bitwise untouched", 1.0),
                             ("offlog", "a blow-up off the log steps within 0.5 nats of the clean run", 1.0)):
        mine = book.of(kind, "guard") if kind in kinds else []
        if mine:
            met = sum(map(book.ok, mine))
            verdict = "meets" if met >= need * len(mine) else "misses"
            lines.append(f"guard: {goal}: {met}/{len(mine)} ({verdict} the goal of {need:.0%})")
    told = [r for r in book.runs.values() if r.arm.startswith("guard") and r.rescues and r.case.family != "hf"]
    if told:
        right = sum(map(doctor_right, told))
        lines.append(f"doctor: cause and advice right on {right}/{len(told)} rescued guard runs "
                     f"({'meets' if right == len(told) else 'misses'} the goal of 100%)")
    return lines


def per_run(book: Book, kinds: tuple[str, ...], arms: tuple[str, ...]) -> list[str]:
    """Every run's final val loss per arm: (n) actions taken, ! stopped, E an error, x the kind's goal missed."""
    lines = [f"{'case':<44} {'seed':>4} {'ref':>6} " + "".join(f"{a:>12}" for a in arms)]
    for case in [c for c in cases() if c.kind in kinds]:
        for seed in sorted({s for (c, _, s) in book.runs if c == case}):
            first = book.runs[(case, "none", seed)]
            cells = []
            for arm in arms:
                r = book.runs.get((case, arm, seed))
                if r is None:
                    cells.append(f"{'-':>12}")
                    continue
                note = (f"({r.rescues})" if r.rescues else "") + ("!" if r.stopped else "") + ("E" if r.error else "") \
                    + ("" if book.ok(r) else "x")
                cells.append(f"{final(r):6.3f}{note:<6}")
            lines.append(f"{case.name:<44} {seed:>4} {final(book.ref(first)):6.3f} " + "".join(cells))
    guarded = [r for r in book.runs.values() if r.arm.startswith("guard") and (r.actions or r.error)]
    if guarded:
        lines.append("what the guard did (its records' kind/action, in order; an error that ended the run):")
        for r in sorted(guarded, key=lambda r: (r.case.name, r.seed, r.arm)):
            lines.append(f"  {r.case.name} seed {r.seed} {r.arm}: {r.actions}" + (f" ERROR at {r.error}" if r.error else ""))
            lines += [f"    doctor{'' if doctor_right(r) else ' (WRONG)'}: {kind} {action}: {cause[:70]} | {fix[:90]}"
                      for kind, action, cause, fix in r.stories]
    return lines


def timing(steps: int, repeats: int, options: dict) -> list[str]:
    """The guard's cost on a healthy run: the Monitor with the guard against the Monitor alone, pairs
    alternating after one untimed run of each (the attach path: against the bare loop); the final
    weights against the bare loop's, bitwise."""
    case = Case("healthy", "adamw_warmup", GOOD["adamw_warmup"])
    base = "none" if options.get("via") == "attach" else "monitor"
    results: dict[str, list[tuple[float, float]]] = {base: [], "guard": []}
    finals = {"none": _one((case, "none", 0, steps, None, True)).state}
    order = [base, "guard"] + [a for i in range(repeats) for a in ((base, "guard") if i % 2 == 0 else ("guard", base))]
    for i, arm in enumerate(order):
        t0, c0 = time.perf_counter(), time.process_time()
        out = _one((case, arm, 0, steps, options, True))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if i >= 2:  # the first of each is untimed
            results[arm].append((wall, cpu))
        finals[arm] = out.state
    same = all(finals["none"][k].equal(finals["guard"][k]) for k in finals["none"])
    wall = statistics.median(g[0] for g in results["guard"]) / statistics.median(b[0] for b in results[base])
    cpu = statistics.median(g[1] for g in results["guard"]) / statistics.median(b[1] for b in results[base])
    verdict = "meets" if min(wall, cpu) <= GOAL_COST else "misses"
    against = "the bare loop" if base == "none" else "the Monitor alone"
    return [f"cost on a healthy run ({case.name}, {steps} steps, {repeats} runs a side): guarded / {against} "
            f"wall {wall:.3f}x, CPU {cpu:.3f}x ({verdict} the goal of <= {GOAL_COST}x)",
            f"final weights bitwise equal with and without the guard: {same}"]


def parse_try(text: str) -> dict:
    out = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        out[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    p.add_argument("--seeds", default=None, help="seeds, comma-separated (default 0,1; --dev: 100,101)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"kinds of trouble, comma-separated (default all: {','.join(KINDS)})")
    p.add_argument("--arms", default=",".join(ARMS), help=f"arms, comma-separated (default all: {','.join(ARMS)})")
    p.add_argument("--workers", type=int, default=2, help="runs trained at once, one thread each (default 2)")
    p.add_argument("--timing-steps", type=int, default=150, help="steps of each timed healthy run (0: no timing)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs a side (default 3)")
    p.add_argument("--dev", action="store_true", help="the development seeds (100, 101), per --try setting")
    p.add_argument("--quick", action="store_true", help="a smoke run: 40 steps, seed 0, no timing")
    p.add_argument("--attach", action="store_true",
                   help="run the guard as a rank without a Monitor does (Guard.attach: the loss alone)")
    p.add_argument("--try", dest="tries", action="append", default=[], metavar="KEY=VALUE,...",
                   help="Guard settings to try (repeatable; the defaults always run)")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    arms = tuple(a for a in args.arms.split(",") if a)
    bad = sorted(set(kinds) - set(KINDS)) + sorted(set(arms) - set(ARMS))
    if bad or "none" not in arms:
        print(f"bench_guard: unknown kind or arm {', '.join(bad)} (kinds: {', '.join(KINDS)}; arms: "
              f"{', '.join(ARMS)}, none always among them)" if bad else "bench_guard: --arms must include none",
              file=sys.stderr)
        return 2
    steps, timing_steps = (40, 0) if args.quick else (args.steps, args.timing_steps)
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else (
        (0,) if args.quick else DEV_SEEDS if args.dev else SEEDS)
    t0 = time.perf_counter()
    via = {"via": "attach"} if args.attach else {}
    watched = tuple(a for a in arms if a != "guard")
    base = run_all(kinds, watched, seeds, steps, args.workers)
    for options in [via] + [{**via, **parse_try(t)} for t in args.tries]:
        runs = base + (run_all(kinds, ("guard",), seeds, steps, args.workers, options, False) if "guard" in arms else [])
        book = Book(runs)
        print(f"trouble table: {len(kinds)} kinds x {len(arms)} arms, seeds {','.join(map(str, seeds))}, "
              f"{steps} steps, guard {options or 'defaults'}" + (" (development seeds)" if args.dev else ""))
        print("\n".join(table(book, kinds, arms) + guard_goals(book, kinds) + per_run(book, kinds, arms)))
    print(f"(the table: {time.perf_counter() - t0:.0f} s)")
    if timing_steps and "guard" in arms:
        print("\n".join(timing(timing_steps, args.repeats, via)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
