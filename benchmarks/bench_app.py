"""What the app costs in a browser and per page, each measured beside its baseline in one run.

    python benchmarks/bench_app.py                     # both sections
    python benchmarks/bench_app.py --skip-pages        # the browser section only
    python benchmarks/bench_app.py --skip-browser --run char_mlp

1. Browser (headless Chromium, benchmarks/browser_timing.py), against a bare Streamlit app (a
   title, a toggle and one small Altair chart per page, two pages): cold start, a fresh
   `streamlit run` to the first chart of `/?run=shakespeare_gpt` (the Overview) drawn; then, on
   that warm server with the model cached, page switches in the navigation and a widget change
   (the loss chart's log-y toggle) to their charts redrawn. Goals: cold start under 4 s, every
   switch or change under 1.5 s. Medians of --cold-repeats fresh servers.
2. Pages (AppTest, in-process as the server runs them): every page's first render with the model
   cached and no probe result cached, against the same probe calls made directly. Goal: a page
   costs at most 1.2x its probes. Medians of --repeats renders, page and probes alternated.
3. Run list (AppTest, a fresh process per load: the first load after a restart): the landing view
   with the shipped runs, against the same with a 200-run sweep beside them (the shipped sweep's
   histories copied under new names, each with its sweep.json entry). Goal: within 1.5x. Medians of
   --list-repeats loads, alternated.
4. First charts (headless Chromium, a fresh server per page): each page's first chart drawn, opened
   directly on a sweep run (history only), on shakespeare_gpt and on a tutorial GPT trained 30 steps
   with the Monitor and save_every (made in the run), against a bare Streamlit page's first chart.
   Goal: within 2x. Medians of --cold-repeats servers.

    python benchmarks/bench_app.py --only list,first   # the sections of issue 38, item 7
    python benchmarks/bench_app.py --only first --first-pages tutorial   # the pages named so only
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun."


def probe_calls(run: Path):
    """The probe calls each page makes, as the app makes them (app/data.py)."""
    import torch

    from models.checkpoint import list_snapshots, load_checkpoint, read_metrics
    from models.sample import continue_text
    from probes import degenerate, entropy, logit_lens, neighbours, projection, updates

    snaps = list_snapshots(run)
    snap, first = load_checkpoint(snaps[-1]), load_checkpoint(snaps[0])
    ids = torch.tensor([snap.tokenizer.encode(TEXT)[: snap.config.n_ctx]])
    attention = snap.config.family == "transformer"

    def grids(s):
        degenerate.run(s.model, ids)

    def lens(s):
        if attention and s.config.unembed != "mlp":
            logit_lens.run(s.model, ids, k=5, tokenizer=s.tokenizer).to_dict()

    return {
        "overview": lambda: (read_metrics(run), continue_text(snap, "ROMEO:", 160, greedy=True),
                             continue_text(snap, "ROMEO:", 160, temperature=0.8, seed=0)),
        "attention": lambda: attention and (grids(snap), entropy.head_pattern(snap.model, ids, 0, 0)),
        "dynamics": lambda: (read_metrics(run), updates.from_run(run)),
        "embeddings": lambda: (neighbours.run(snap.model, "e", k=10, tokenizer=snap.tokenizer),
                               projection.run(snap.model, "input")),
        "lens": lambda: lens(snap),
        "compare": lambda: attention and (grids(snap), grids(first), lens(snap), lens(first)),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default="shakespeare_rms4", help="a run under checkpoints/ (the pages section)")
    p.add_argument("--repeats", type=int, default=3, help="renders per page in the pages section")
    p.add_argument("--cold-repeats", type=int, default=3, help="fresh servers per app in the browser section")
    p.add_argument("--skip-browser", action="store_true", help="leave out the browser section")
    p.add_argument("--skip-pages", action="store_true", help="leave out the AppTest pages section")
    p.add_argument("--only", help="comma-separated sections to run: browser, pages, list, first")
    p.add_argument("--list-repeats", type=int, default=3, help="loads per run list in the run list section")
    p.add_argument("--list-runs", type=int, default=200, help="runs in the run list section's sweep")
    p.add_argument("--first-pages", help="the first charts section: only the pages whose name contains this")
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else {"browser", "pages", "list", "first"}
    if "browser" in only and not args.skip_browser:
        from browser_timing import report

        report(REPO, args.cold_repeats)
    if "pages" in only and not args.skip_pages:
        pages_section(args)
    if "list" in only:
        run_list_section(args.list_runs, args.list_repeats)
    if "first" in only and not args.skip_browser:
        from browser_timing import first_charts

        first_charts(REPO, args.cold_repeats, args.first_pages)


def pages_section(args: argparse.Namespace) -> None:
    os.environ["SCRATCHSCOPE_RUNS"] = str(REPO / "checkpoints" / args.run)
    os.environ["SCRATCHSCOPE_NO_SHIPPED"] = "1"
    import streamlit as st
    import torch
    from streamlit.testing.v1 import AppTest

    torch.set_num_threads(1)  # as the app runs its models (app.data.load)
    calls = probe_calls(REPO / "checkpoints" / args.run)
    at = AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=300)
    at.run()
    print(f"== app pages on checkpoints/{args.run} ({torch.get_num_threads()} threads), model cached, "
          f"probe results not")
    print(f"{'page':<12}{'page (s)':>10}{'probes (s)':>12}{'page/probes':>13}")
    for name, call in calls.items():
        at.switch_page(f"views/{name}.py").run()  # warm: the model is loaded and cached
        page_times, probe_times = [], []
        for _ in range(args.repeats):
            st.cache_data.clear()
            t0 = time.perf_counter()
            at.switch_page(f"views/{name}.py").run()
            page_times.append(time.perf_counter() - t0)
            assert not at.exception, [e.value for e in at.exception]
            t0 = time.perf_counter()
            call()
            probe_times.append(time.perf_counter() - t0)
        page, probes = statistics.median(page_times), statistics.median(probe_times)
        print(f"{name:<12}{page:>10.3f}{probes:>12.3f}{page / probes:>13.2f}x")


SHIPPED_SWEEP = REPO / "checkpoints" / "sweep_qk_norm"
FIRST_LOAD = """import sys, time
sys.path.insert(0, {repo!r})
import app.shell as shell
from streamlit.testing.v1 import AppTest
spent, main = [], shell.main
def timed():  # the script run itself, as the server runs it (AppTest's own polling left out)
    t0 = time.perf_counter()
    try:
        main()
    finally:
        spent.append(time.perf_counter() - t0)
shell.main = timed
at = AppTest.from_file({app!r}, default_timeout=600)
t0 = time.perf_counter()
at.run()
total = time.perf_counter() - t0
assert not at.exception, [e.value for e in at.exception]
print(spent[0], total, len(at.dataframe[0].value), len(at.sidebar.selectbox(key="run").options))
"""


def copied_sweep(dest: Path, n: int) -> Path:
    """A sweep of `n` runs in `dest`: the shipped sweep's runs (metrics.jsonl and run.json) copied
    under new names (`lr=1e-03,qk_norm=none,copy=3`), each with its own sweep.json entry."""
    import json
    import shutil

    book = json.loads((SHIPPED_SWEEP / "sweep.json").read_text())
    base, runs = book["runs"], []
    dest.mkdir(parents=True)
    for k in range(n):
        entry = dict(base[k % len(base)])
        name = f"{entry['dir']},copy={k // len(base)}"
        shutil.copytree(SHIPPED_SWEEP / entry["dir"], dest / name)
        entry.update(name=name, dir=name, log=None)
        runs.append(entry)
    book["runs"] = runs
    (dest / "sweep.json").write_text(json.dumps(book))
    return dest


def first_load(env: dict[str, str]) -> tuple[float, float, int, int]:
    """The landing view's first load in a fresh process: seconds of its script run and of AppTest's
    whole run, its table's rows, the runs in the sidebar."""
    import subprocess

    code = FIRST_LOAD.format(repo=str(REPO), app=str(REPO / "app" / "main.py"))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    script, total, rows, runs = out.stdout.split()
    return float(script), float(total), int(rows), int(runs)


def run_list_section(n: int, repeats: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        copied_sweep(Path(folder) / f"sweep{n}", n)
        base = {k: v for k, v in os.environ.items() if k not in ("SCRATCHSCOPE_RUNS", "SCRATCHSCOPE_NO_SHIPPED")}
        cases = {"shipped": base, f"shipped + {n}-run sweep": {**base, "SCRATCHSCOPE_RUNS": folder}}
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        shape = {}
        for _ in range(repeats):  # alternated, so that a busy moment hits both
            for name, env in cases.items():
                script, total, rows, runs = first_load(env)
                times[name].append((script, total))
                shape[name] = (rows, runs)
    print(f"== the run list's first load after a restart (AppTest, a fresh process each), median of {repeats}")
    print(f"{'':<28}{'runs':>6}{'table rows':>12}{'script run (s)':>16}{'ratio':>8}{'AppTest run (s)':>17}{'ratio':>8}")
    first = [statistics.median(t[i] for t in times["shipped"]) for i in (0, 1)]
    for name, measured in times.items():
        rows, runs = shape[name]
        script, total = (statistics.median(t[i] for t in measured) for i in (0, 1))
        print(f"{name:<28}{runs:>6}{rows:>12}{script:>16.2f}{script / first[0]:>7.2f}x{total:>17.2f}"
              f"{total / first[1]:>7.2f}x")
    print("goal: the 200-run list's script run within 1.5x of the shipped one's (AppTest's run adds its own "
          "polling for the page's elements)")


if __name__ == "__main__":
    main()
