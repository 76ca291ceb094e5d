"""The run list with a sweep (issue 38, item 2): a sweep is one row of the run list and its runs fold
under it (read from sweep.json, so no doctor runs for them); every run box and link shows the part of
a name that tells runs apart first (`lr=1e-03,qk_norm=none`, never `sweep_qk_norm/lr=1e-03,` twice);
`?run=SWEEP`, the name the Sweeps table shows, opens that sweep's page."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from app_kit import open_app

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / "checkpoints" / "sweep_qk_norm"
BOOK = json.loads((SWEEP / "sweep.json").read_text())
OTHERS = [REPO / "checkpoints" / "mha4", REPO / "checkpoints" / "char_mlp"]
BOX_CHARS = 21  # what the sidebar's run box shows at 1280 px before its ellipsis (tests/test_browser_runlist.py)


@pytest.fixture
def doctor_calls(monkeypatch):
    """The paths the run doctor was asked about while the app ran."""
    from probes import diagnose

    calls, real = [], diagnose.run
    monkeypatch.setattr(diagnose, "run", lambda path, *a, **k: (calls.append(Path(path)), real(path, *a, **k))[1])
    return calls


def test_a_sweep_is_one_row_of_the_run_list_from_its_sweep_json(monkeypatch, doctor_calls):
    at = open_app(monkeypatch, roots=[*OTHERS, SWEEP])
    table = at.dataframe[0].value.set_index("run")
    assert list(table.index) == ["mha4", "char_mlp", "sweep_qk_norm"]  # no row per sweep run
    row = table.loc["sweep_qk_norm"]
    runs = BOOK["runs"]
    diverged = sum(r["diverged_at"] is not None for r in runs)
    assert diverged and row["state"] == f"{diverged}/{len(runs)} diverged"  # every run finished
    verdicts = [r["verdict"] for r in runs]
    assert row["doctor"] == f"{verdicts.count('failed')} failed"  # the worst verdict's count
    fold = next(e.label for e in at.expander if e.label.startswith("sweep_qk_norm"))
    assert fold.endswith(")") and all(f"{verdicts.count(v)} {v}" in fold for v in set(verdicts))  # every count
    best = min(r["final_val_loss"] for r in runs if r["diverged_at"] is None)
    assert row["last val loss"] == f"best {best:.3f}"
    assert row["snapshots"] == 0  # its runs keep their histories only (it read <NA>)
    # the sweep's runs carry their verdicts in sweep.json: the doctor read the two other runs only
    assert doctor_calls and all(SWEEP.resolve() not in p.resolve().parents for p in doctor_calls)


def test_the_sweeps_runs_fold_under_it_with_links_named_by_what_differs(monkeypatch):
    at = open_app(monkeypatch, roots=[*OTHERS, SWEEP])
    fold = next(e for e in at.expander if e.label.startswith("sweep_qk_norm"))
    inside = fold.dataframe[0].value
    assert sorted(inside["run"]) == sorted(f"sweep_qk_norm/{r['dir']}" for r in BOOK["runs"])
    assert dict(zip(inside["run"], inside["verdict"])) == {f"sweep_qk_norm/{r['dir']}": r["verdict"]
                                                           for r in BOOK["runs"]}
    links = {p.proto.label: p.proto.query_string for p in fold.get("page_link")}
    assert sorted(links) == sorted(r["dir"] for r in BOOK["runs"])  # each run's own name, each once
    assert all(parse_qs(q)["run"] == [f"sweep_qk_norm/{name}"] for name, q in links.items())  # ?run= its label
    # the page's own "Open a run" links: the runs outside any sweep, not the sweep's 14 again
    outside = [p.proto.label for p in at.get("page_link") if p.proto.label not in links]
    assert "mha4" in outside and "char_mlp" in outside and not any("qk_norm" in t for t in outside
                                                                  if not t.startswith("Sweep "))


def test_the_run_box_shows_the_part_that_tells_sweep_runs_apart_first(monkeypatch):
    at = open_app(monkeypatch, roots=[*OTHERS, SWEEP], run="sweep_qk_norm/lr=1e-03,qk_norm=rms")
    box = at.sidebar.selectbox(key="run")
    assert box.value == "sweep_qk_norm/lr=1e-03,qk_norm=rms"  # the label, as ?run= names it
    shown = box.options  # what the box shows for each
    assert "lr=1e-03,qk_norm=rms · sweep_qk_norm" in shown
    assert len({text[:BOX_CHARS] for text in shown}) == len(shown)  # the visible part differs for every run


def test_run_equals_a_sweep_opens_its_sweep_page(monkeypatch):
    for page in (None, "dynamics"):
        at = open_app(monkeypatch, roots=[*OTHERS, SWEEP], run="sweep_qk_norm")
        if page:  # a page other than the landing view, the same link
            at.query_params["run"] = "sweep_qk_norm"
            at.switch_page(f"views/{page}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        assert "Sweep" in [t.value for t in at.title]
        assert at.selectbox(key="sweep_pick").value == "sweep_qk_norm"
        assert not any("names no run" in w.value for w in at.warning)
    at = open_app(monkeypatch, roots=[*OTHERS, SWEEP], run="no_such_thing")
    assert any("names no run" in w.value for w in at.warning)  # a name that is neither still says so


def test_the_sweep_pages_links_name_each_run_by_its_own_name(monkeypatch):
    at = open_app(monkeypatch, roots=[SWEEP], page="sweep", sweep="sweep_qk_norm")
    links = {p.proto.label for p in at.get("page_link") if "run=" in p.proto.query_string}
    assert links == {r["dir"] for r in BOOK["runs"]}
