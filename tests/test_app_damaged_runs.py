"""The run list keeps working when one run's files say something absurd (issue 37): every other
run is still listed, with its own numbers."""

from __future__ import annotations

import json
from pathlib import Path

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
