"""The run list keeps working when one run's files say something absurd (issue 37): every other
run is still listed, with its own numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app_kit import open_app

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints"


def test_a_step_past_int64_in_one_run_does_not_sink_the_run_list(tmp_path, monkeypatch):
    shipped_run = SHIPPED / "char_mlp"
    for name, step in (("huge", 2 ** 70), ("plain", 7)):
        run = tmp_path / name
        run.mkdir()
        (run / "run.json").write_bytes((shipped_run / "run.json").read_bytes())
        lines = (shipped_run / "metrics.jsonl").read_text().splitlines()[:3]
        last = json.loads(lines[-1])
        last["step"] = step
        (run / "metrics.jsonl").write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    at = open_app(monkeypatch, roots=[tmp_path])
    table = at.dataframe[0].value.set_index("run")
    assert table.loc["plain", "steps"] == 7
    assert table.loc["huge", "steps"] == float(2 ** 70)


DAMAGES = {
    "run.json a list": lambda d: (d / "run.json").write_text("[1, 2]"),
    "run.json not JSON": lambda d: (d / "run.json").write_text("{oops"),
    "run.json fields of the wrong kind": lambda d: (d / "run.json").write_text(json.dumps({"model": "big", "train": 3})),
    "metrics.jsonl garbage": lambda d: (d / "metrics.jsonl").write_text('garbage\n[1]\n{"step": "x"}\n'),
    "a snapshot's config.json": lambda d: [(p / "config.json").write_text('{"model": 5}') for p in d.glob("step_*")],
    "a snapshot's weights": lambda d: [(p / "model.safetensors").write_bytes(b"xx") for p in d.glob("step_*")],
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_every_page_says_what_is_damaged_without_a_traceback(damage, tmp_path, monkeypatch):
    """A damaged file of one run (issue 37): no page raises, and no error box calls it 'an unexpected'
    bug; the healthy run beside it keeps its row. The sidebar read run.json for the text to probe and
    failed every page of a run whose run.json was not JSON; Compare called a run.json whose model
    was a string an unexpected AttributeError."""
    shutil.copytree(SHIPPED / "mha4", tmp_path / "bad")
    shutil.copytree(SHIPPED / "mha4", tmp_path / "good", ignore=shutil.ignore_patterns("step_000[0-4]*"))
    DAMAGES[damage](tmp_path / "bad")
    at = open_app(monkeypatch, roots=[tmp_path], run="bad")
    for page in ("attention", "dynamics", "compare"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not [e.value for e in at.error if "unexpected" in e.value], page
