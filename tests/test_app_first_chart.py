"""Each model page draws its first chart before torch (or TransformerLens) is imported, from the first
view saved beside the snapshot (`probes.first_view`), on a shipped run and on a tutorial GPT trained
with the Monitor and `save_every`; and that chart's numbers are the probes' on the model.

One subprocess opens every page in AppTest: this test process has imported torch, which would hide
an import. Each page's script run stops at its first chart (what it had imported is recorded there),
so that the model it loads behind that chart is not imported into the next page's count. The last
page is the control: the Attention page on a text no view holds loads the model first, and there
torch is seen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from models.store import load_checkpoint
from probes import page_view
from probes.first_view import PAGE_TEXT
from close import agree, differences
from test_first_view import read_back
from test_app_any_snapshot import runs  # noqa: F401 - fixture: a tutorial GPT's Monitor run

REPO = Path(__file__).resolve().parent.parent
PAGES = ("attention", "embeddings", "lens", "compare")

FIRST_CHARTS = """
import json, sys
import streamlit as st
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.delta_generator import DeltaGenerator
from streamlit.testing.v1 import AppTest
import app.warm
app.warm.model_stack = lambda: None  # the background import after a page: only the page's own imports count

first = []
enqueue = DeltaGenerator._enqueue
def watched(self, kind, *args, **kwargs):
    out = enqueue(self, kind, *args, **kwargs)
    if kind == "vega_lite_chart":
        first.append([m for m in ("torch", "transformer_lens") if m in sys.modules])
        st.stop()  # the page's run ends at its first chart
    return out
DeltaGenerator._enqueue = watched

report = {}
for run, pages in json.loads(sys.argv[1]):
    at = AppTest.from_file("app/main.py", default_timeout=300)
    at.query_params["run"] = run
    at.run()
    for page, text in pages:
        if text is not None:
            at.sidebar.text_area[0].set_value(text)
        first.clear()
        at.switch_page(f"views/{page}.py").run()
        chart = at.get("vega_lite_chart")[0].proto
        rows = convert_arrow_bytes_to_pandas_df(chart.datasets[0].data.data).to_dict("records")
        report[f"{run}/{page}/{text is not None}"] = {"imported": first[0], "rows": rows,
                                                      "errors": [e.value for e in at.exception]}
print(json.dumps(report, default=str))
"""


def first_charts(runs: Path) -> dict:
    plan = [["shakespeare_gpt", [[p, None] for p in PAGES]], ["tutorial", [[p, None] for p in PAGES]],
            ["shakespeare_gpt", [["attention", "First Citizen:\nBefore we proceed any further"]]]]
    env = {**os.environ, "SCRATCHSCOPE_RUNS": str(runs), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", FIRST_CHARTS, json.dumps(plan)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_each_model_page_draws_its_first_chart_before_torch_and_from_the_probes_numbers(runs):  # noqa: F811
    report = first_charts(runs)
    for run in ("shakespeare_gpt", "tutorial"):
        for page in PAGES:
            seen = report[f"{run}/{page}/False"]
            assert not seen["errors"], (run, page, seen["errors"])
            assert seen["imported"] == [], (run, page, seen["imported"])
    assert report["shakespeare_gpt/attention/True"]["imported"] == ["torch", "transformer_lens"]  # the control
    for run, path in (("shakespeare_gpt", REPO / "checkpoints" / "shakespeare_gpt"), ("tutorial", runs / "tutorial")):
        snap = load_checkpoint(path)
        ids, _ = page_view.snapshot_ids(snap, PAGE_TEXT)
        grid = page_view.attention(snap.model, ids)  # the probe on the model
        # the chart shows the first view saved on whatever machine wrote it; the probe runs here:
        # equal to the float32 rounding, relative to each grid's scale (tests/close.py)
        cells = {(r["layer"], r["head"]): r for r in report[f"{run}/attention/False"]["rows"]}
        assert len(cells) == len(grid["verdicts"]) * len(grid["verdicts"][0])
        assert [cells[k]["verdict"] for k in sorted(cells)] == [v for row in grid["verdicts"] for v in row]
        drawn = [[cells[(l, h)]["normalised entropy"] for h in range(len(row))] for l, row in enumerate(grid["normalized"])]
        assert agree(drawn, grid["normalized"]), differences(drawn, grid["normalized"])
        lens = page_view.lens(snap.model, ids, 5, snap.tokenizer)
        kl = {(r["layer"], r["label"]): r["KL to final (nats)"] for r in report[f"{run}/lens/False"]["rows"]}
        drawn = [[[kl[(label, f"{pos}: {_shown(lens['pieces'][0][pos])}")] for pos in range(len(per[0]))]]
                 for label, per in zip(lens["layers"], lens["kl_to_final_per_position"])]
        assert agree(drawn, lens["kl_to_final_per_position"]), differences(drawn, lens["kl_to_final_per_position"])
        bases = {t: page_view.baseline(snap.model, t, 10) for t in ("input", "output", "cross")}
        opened = next((t for t, b in bases.items() if b["table_median"] > b["shuffled_level"]), "input")
        projected = page_view.embedding_map(snap.model, "output" if opened == "output" else "input", snap.tokenizer)
        points = sorted(report[f"{run}/embeddings/False"]["rows"], key=lambda r: r["id"])
        drawn = [[r["x"] for r in points], [r["y"] for r in points]]
        assert agree(drawn, [list(projected["x"]), list(projected["y"])])
    snap = load_checkpoint(runs / "tutorial")  # a snapshot of any model, read without its code
    parts, info = read_back(snap.path, snap.tokenizer)
    assert type(snap.model).__name__ == "SavedModel" and info["text"] is None  # row 0 of its saved sample
    expected, skipped = page_view.first_view(snap.model, snap.tokenizer, torch.tensor([info["tokens"]]))
    assert info["skipped"] == skipped and agree(parts, expected), differences(parts, expected)  # every part


def _shown(piece: str) -> str:
    from app.data import shown
    return shown(piece)
