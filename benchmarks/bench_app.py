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
    args = p.parse_args(argv)
    if not args.skip_browser:
        from browser_timing import report

        report(REPO, args.cold_repeats)
    if not args.skip_pages:
        pages_section(args)


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
        at.switch_page(f"screens/{name}.py").run()  # warm: the model is loaded and cached
        page_times, probe_times = [], []
        for _ in range(args.repeats):
            st.cache_data.clear()
            t0 = time.perf_counter()
            at.switch_page(f"screens/{name}.py").run()
            page_times.append(time.perf_counter() - t0)
            assert not at.exception, [e.value for e in at.exception]
            t0 = time.perf_counter()
            call()
            probe_times.append(time.perf_counter() - t0)
        page, probes = statistics.median(page_times), statistics.median(probe_times)
        print(f"{name:<12}{page:>10.3f}{probes:>12.3f}{page / probes:>13.2f}x")


if __name__ == "__main__":
    main()
