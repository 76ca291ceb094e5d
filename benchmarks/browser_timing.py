"""Timing the app in a real headless Chromium (Debian's /usr/bin/chromium via Playwright), for
benchmarks/bench_app.py: a fresh `streamlit run` to the first chart drawn, and a click (a page in
the navigation, a widget) to its charts redrawn, each beside a bare Streamlit page doing the same.

"Drawn" is read in the page itself: a MutationObserver stamps `performance.now()` each time a node
changes inside a Vega chart, and a step ends at the last such change once the page has been quiet
(no chart change, no running-man status widget) for QUIET_MS.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from browser_kit import chromium, streamlit_server  # noqa: E402  (the browser tests' server and browser)

QUIET_MS = 1500
CHART = '[data-testid="stVegaLiteChart"]'

WATCH = """() => {
  window.__chartChanged = null; window.__firstChart = null; window.__running = 0;
  setInterval(() => {  // the running-man widget: the last moment a script run was under way
    if (document.querySelector('[data-testid="stStatusWidget"]')) window.__running = performance.now();
  }, 50);
  new MutationObserver(ms => {
    if (!ms.some(m => m.target.closest && m.target.closest('%s'))) return;
    window.__chartChanged = performance.now();
    if (window.__firstChart === null && document.querySelector('%s canvas, %s svg'))
      window.__firstChart = window.__chartChanged;
  }).observe(document, {subtree: true, childList: true});
}""" % (CHART, CHART, CHART)

BARE_PAGE = """import altair as alt, pandas as pd, streamlit as st
st.title("{title}")
st.altair_chart(alt.Chart(pd.DataFrame({{"step": [0, 1, 2, 3], "loss": [4.0, 3.1, 2.7, 2.5]}}))
                .mark_line().encode(x="step", y=alt.Y("loss", scale=alt.Scale(type="log" if st.toggle("log y-axis") else "linear"))))
"""
BARE_APP = """import streamlit as st
st.navigation([st.Page("one.py", title="One", default=True), st.Page("two.py", title="Two")]).run()
"""


def settle(page, charts: int) -> float:
    """performance.now() of the last chart change, once `charts` charts are drawn and the page is quiet."""
    page.wait_for_function(f"document.querySelectorAll('{CHART} canvas, {CHART} svg').length >= {charts}",
                           timeout=180_000)
    while True:
        page.wait_for_timeout(250)
        quiet = page.evaluate(f"""() => !document.querySelector('[data-testid="stStatusWidget"]')
                                       && performance.now() - window.__chartChanged > {QUIET_MS}""")
        if quiet:
            return page.evaluate("window.__chartChanged")


def cold_start(browser, url: str, started: float, path: str, charts: int) -> tuple[dict[str, float], object]:
    """A new tab on `path` of a server started at `started`: seconds to the server answering, to the
    first chart drawn, to the page's script run done (its last chart drawn and no run under way);
    and the tab."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.add_init_script(f"({WATCH})()")
    opened = time.perf_counter()
    page.goto(url + path, timeout=180_000)
    drawn = settle(page, charts) / 1000  # the tab's clock starts at its navigation, just after `opened`
    done = max(drawn, page.evaluate("window.__running") / 1000)
    first = page.evaluate("window.__firstChart") / 1000
    up = opened - started
    return {"cold start: server up": up, "cold start: first chart": up + first,
            "cold start: script done": up + done}, page


def click_to_drawn(page, click, charts: int) -> float:
    """Seconds from `click()` to its charts drawn (the tab's own clock on both ends)."""
    page.evaluate("window.__chartChanged = null")
    t0 = page.evaluate("performance.now()")
    click()
    page.wait_for_function("window.__chartChanged !== null", timeout=180_000)
    return (settle(page, charts) - t0) / 1000


def bare_app(folder: Path) -> Path:
    """A bare Streamlit app in `folder`: pages One and Two, each a title, a toggle and one small chart."""
    (folder / "one.py").write_text(BARE_PAGE.format(title="One"))
    (folder / "two.py").write_text(BARE_PAGE.format(title="Two"))
    (folder / "bare.py").write_text(BARE_APP)
    return folder / "bare.py"


def nav_click(page, title: str):
    return lambda: page.locator('[data-testid="stSidebarNav"] a').filter(has_text=title).first.click()


def toggle_click(page, label: str):
    return lambda: page.get_by_text(label, exact=True).first.click()


def measure(browser, script: Path, cwd: Path, env: dict[str, str], path: str, charts: int,
            steps: list[tuple[str, str, str, int]]) -> dict[str, float]:
    """One fresh server: cold start (first chart, page quiet), then each (name, kind, target, charts)
    step: kind "page" clicks `target` in the navigation, "toggle" clicks the toggle labelled so."""
    with streamlit_server(script, cwd, env, "--server.fileWatcherType", "none") as (url, started):
        out, page = cold_start(browser, url, started, path, charts)
        for name, kind, target, n in steps:
            click = nav_click(page, target) if kind == "page" else toggle_click(page, target)
            out[name] = click_to_drawn(page, click, n)
        page.close()
        return out


def report(repo: Path, repeats: int) -> None:
    import os
    import statistics

    env = {**os.environ, "PYTHONPATH": str(repo)}
    # (name, kind, target, charts at least): the first visit to a page pays for the browser loading
    # the JavaScript of a kind of element it had not drawn yet (the data grid on Training dynamics)
    app_steps = [("page switch", "page", "Training dynamics", 5), ("page switch back", "page", "Overview", 2),
                 ("widget change", "toggle", "log y-axis", 2), ("page switch, second visit", "page",
                 "Training dynamics", 5), ("switch to Attention", "page", "Attention", 3),
                 ("switch to Embeddings", "page", "Embeddings", 1), ("switch to Logit lens", "page", "Logit lens", 2),
                 ("switch to Compare", "page", "Compare", 6)]
    bare_steps = [("page switch", "page", "Two", 1), ("page switch back", "page", "One", 1),
                  ("widget change", "toggle", "log y-axis", 1), ("page switch, second visit", "page", "Two", 1),
                  ("switch to Attention", "page", "One", 1), ("switch to Embeddings", "page", "Two", 1),
                  ("switch to Logit lens", "page", "One", 1), ("switch to Compare", "page", "Two", 1)]
    with chromium() as browser, tempfile.TemporaryDirectory() as folder:
        bare = bare_app(Path(folder))
        runs: dict[str, list[dict[str, float]]] = {"bare": [], "app": []}
        for _ in range(repeats):  # alternated, so that a busy moment hits both
            runs["bare"].append(measure(browser, bare, Path(folder), env, "/", 1, bare_steps))
            runs["app"].append(measure(browser, repo / "app" / "main.py", repo, env, "/?run=shakespeare_gpt", 2,
                                       app_steps))
    print(f"== the app in headless Chromium vs a bare Streamlit app, median of {repeats} fresh servers "
          f"({os.cpu_count()} cores)")
    print(f"{'':<40}{'bare (s)':>10}{'app (s)':>10}{'app/bare':>10}{'goal (s)':>10}")
    for name in runs["app"][0]:
        bare_s = statistics.median(r[name] for r in runs["bare"])
        app_s = statistics.median(r[name] for r in runs["app"])
        goal = "4" if name.startswith("cold start: first") else "" if name.startswith("cold") else "1.5"
        print(f"{name:<40}{bare_s:>10.2f}{app_s:>10.2f}{app_s / bare_s:>9.1f}x{goal:>10}")
    print("app: /?run=shakespeare_gpt (Overview), then Training dynamics, back to the Overview, its loss "
          "chart's log-y toggle, Training dynamics again, then Attention, Embeddings, Logit lens, Compare; "
          "bare: pages One and Two in turn, and its log-y toggle")


# (name, address) of each page's first visit on a fresh server: a sweep run (history only), a run with
# weights, and a tutorial GPT trained with the Monitor (a snapshot of any model, opened without its code)
FIRST_PAGES = [("runs (run list)", "/"), ("sweep run: Overview", "/?run=sweep_qk_norm/lr%3D1e-03%2Cqk_norm%3Dnone"),
               ("sweep run: Training dynamics", "/dynamics?run=sweep_qk_norm/lr%3D1e-03%2Cqk_norm%3Dnone"),
               ("Sweep", "/sweep?sweep=sweep_qk_norm"), ("Overview", "/?run=shakespeare_gpt"),
               ("Attention", "/attention?run=shakespeare_gpt"), ("Training dynamics", "/dynamics?run=shakespeare_gpt"),
               ("Embeddings", "/embeddings?run=shakespeare_gpt"), ("Logit lens", "/lens?run=shakespeare_gpt"),
               ("Compare", "/compare?run=shakespeare_gpt"), ("tutorial GPT: Overview", "/?run=tutorial_gpt"),
               ("tutorial GPT: Attention", "/attention?run=tutorial_gpt"),
               ("tutorial GPT: Embeddings", "/embeddings?run=tutorial_gpt"),
               ("tutorial GPT: Logit lens", "/lens?run=tutorial_gpt"), ("tutorial GPT: Compare", "/compare?run=tutorial_gpt")]
TABLE = '[data-testid="stDataFrame"]'
TUTORIAL_STEPS, TUTORIAL_SAVE_EVERY = 30, 10


def tutorial_run(folder: Path, repo: Path) -> Path:
    """`folder/tutorial_gpt`: the video tutorial's GPT (tests/gpt_kit/tutorial.py's BatchedGPT: its layout and
    its (logits, loss) forward), 2 layers of 4 heads, d 32, context 64, trained TUTORIAL_STEPS AdamW steps
    on Tiny Shakespeare's characters in a plain loop with the Monitor, a snapshot every TUTORIAL_SAVE_EVERY
    (snapshots of any model: the app opens them without the model's code)."""
    import torch
    from gpt_kit import BatchedGPT

    from models.tokenizers import CharTokenizer
    from train.monitor import Monitor

    text = (repo / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    tokenizer = CharTokenizer.from_text(text)
    ids = torch.tensor(tokenizer.encode(text[:200_000]))  # [n]
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = BatchedGPT(n_layers=2, n_heads=4, d=32, ctx=64, vocab=tokenizer.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    eval_tokens = ids[-8 * 64:].view(8, 64)  # [batch ctx]
    out = folder / "tutorial_gpt"
    with Monitor(model, optimizer, out, log_every=5, eval_every=TUTORIAL_SAVE_EVERY, save_every=TUTORIAL_SAVE_EVERY,
                 report=False, eval_tokens=eval_tokens, tokenizer=tokenizer) as monitor:
        for step in range(TUTORIAL_STEPS + 1):
            starts = torch.randint(0, len(ids) - 65, (16,), generator=generator)
            batch = torch.stack([ids[s:s + 65] for s in starts])  # [batch ctx+1]
            _, loss = model(batch[:, :-1], batch[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.log(step, train_loss=loss.item())
    return out


def first_drawn(browser, script: Path, cwd: Path, env: dict[str, str], path: str, table: bool = False) -> float:
    """A fresh server, a new tab on `path`: seconds from the tab's navigation to the page's first
    chart drawn (`table`: to its first table shown, for the run list, which draws no chart)."""
    with streamlit_server(script, cwd, env, "--server.fileWatcherType", "none") as (url, _):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.add_init_script(f"({WATCH})()")
        page.goto(url + path, timeout=180_000)
        if table:
            page.wait_for_selector(TABLE, timeout=180_000)
            seconds = page.evaluate("performance.now()") / 1000
        else:
            page.wait_for_function("window.__firstChart !== null", timeout=180_000)
            seconds = page.evaluate("window.__firstChart") / 1000
        page.close()
        return seconds


def first_charts(repo: Path, repeats: int, only: str | None = None) -> None:
    """Each page's first chart on its first visit to a fresh server, against a bare Streamlit page's.
    `only`: the pages whose name contains it (all by default)."""
    import os
    import statistics

    pages = [(name, path) for name, path in FIRST_PAGES if only is None or only in name]
    with chromium() as browser, tempfile.TemporaryDirectory() as folder:
        bare = bare_app(Path(folder))
        runs = Path(folder) / "runs"
        tutorial_run(runs, repo)
        env = {**os.environ, "PYTHONPATH": str(repo), "SCRATCHSCOPE_RUNS": str(runs)}
        times: dict[str, list[float]] = {"bare": [], **{name: [] for name, _ in pages}}
        for _ in range(repeats):  # alternated, so that a busy moment hits both
            for name, path in pages:
                times["bare"].append(first_drawn(browser, bare, Path(folder), env, "/"))
                times[name].append(first_drawn(browser, repo / "app" / "main.py", repo, env, path, table=path == "/"))
    bare_s = statistics.median(times.pop("bare"))
    print(f"== each page's first chart on a fresh server (headless Chromium, tab opened to first chart drawn), "
          f"median of {repeats} ({os.cpu_count()} cores); bare Streamlit page: {bare_s:.2f} s")
    print(f"{'page':<34}{'address':<60}{'first chart (s)':>16}{'/bare':>8}")
    for name, path in pages:
        seconds = statistics.median(times[name])
        print(f"{name:<34}{path:<60}{seconds:>16.2f}{seconds / bare_s:>7.1f}x")
    print("goal: every page within 2x of the bare page (the run list: its table shown); tutorial_gpt: a "
          f"{TUTORIAL_STEPS}-step Monitor run of a tutorial GPT with save_every={TUTORIAL_SAVE_EVERY}")
