"""The Development page on a run of hand-set heads (tests/development_kit.py): the phase changes
in a table with a link to the Attention page at that step, the heads x snapshots heatmap with a
link from each cell, the changes as rules on the loss chart; a run it cannot read says why."""

from __future__ import annotations

import math

from app_kit import open_app
from chart_kit import specs
from development_kit import hand_set, save_run


def test_development_page_on_a_run_with_a_phase_change(monkeypatch, tmp_path):
    from models.checkpoint import append_metrics

    run = save_run(tmp_path / "hand", [(s, hand_set(0.0 if s < 300 else 40.0)) for s in range(0, 500, 100)])
    for step in range(0, 500, 50):
        append_metrics(run, {"step": step, "train_loss": 3.0 if step < 300 else 1.0})
    at = open_app(monkeypatch, [tmp_path], page="development", run="hand")
    assert [t.value for t in at.main.title] == ["Development"]
    assert not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    row = table[table["kind"] == "induction_heads"].iloc[0]
    # switched on between the snapshots at 200 and 300: read half-way, the link opens the one after
    assert (row["step"], row["heads"], row["between snapshots"]) == (250, "L1H0", "200..300")
    assert row["attention"] == "attention?run=hand&snapshot=step_000300"
    # the hand-set unembedding reads the token alone: removing the heads leaves the repeat's loss as it was
    with_heads, without = row["without its heads"].removesuffix(" at step 300").split(" -> ")
    # each position's loss is ln(e + 15) (target not the current token), or 1 less: the mean lies between
    assert with_heads == without and math.log(math.e + 15) - 1 <= float(with_heads) <= math.log(math.e + 15) + 0.005
    (spec, frames), = specs(at, "induction (Olsson, on a random repeat) per head over snapshots")
    cells = frames[0]
    assert set(cells["head"]) == {"L0H0", "L1H0"} and len(cells) == 10  # a head's row is its own
    assert spec["encoding"]["href"]["field"] == "link"
    assert "attention?run=hand&snapshot=step_000400" in set(cells["link"])
    (loss_spec, loss_frames), = specs(at, "loss, with the phase changes")
    assert any(250 in set(f.get("step", [])) and "change" in f for f in loss_frames)


def test_a_lone_snapshot_has_no_development(monkeypatch, tmp_path):
    from models.checkpoint import save_snapshot

    save_snapshot(tmp_path / "lone", hand_set(1.0), None, step=0)
    at = open_app(monkeypatch, [tmp_path / "lone"], page="development")
    assert not at.exception and not at.error
    assert any("lone snapshot" in i.value for i in at.info)


def test_a_run_without_attention_is_said_in_the_page(monkeypatch, tmp_path):
    from models import build_model
    from models.checkpoint import save_snapshot
    from models.presets import get_preset

    model = build_model(get_preset("char_mlp"))
    for step in (0, 10):
        save_snapshot(tmp_path / "mlp" / f"step_{step:06d}", model, None, step=step)
    at = open_app(monkeypatch, [tmp_path], page="development", run="mlp")
    assert [e.value for e in at.error] and "no attention" in at.error[0].value


def test_the_heat_map_names_every_head():
    """Vega drops overlapping axis labels by default: the heat map said L1H0 and not L1H1 (the strongest
    induction head of a user's run). Its head axis keeps every label, each row tall enough for one."""
    from app.views.development import heatmap

    snapshots = [{"step": s, "snapshot": f"step_{s:06d}", "entropy": [[0.5] * 4, [0.5] * 4]} for s in (0, 10)]
    spec = heatmap(snapshots, "entropy", "run").to_dict()
    assert spec["encoding"]["y"]["axis"]["labelOverlap"] is False
    assert spec["height"] >= 11 * 8  # 8 heads, each row at least one label's font size high
    assert spec["encoding"]["y"]["sort"] == [f"L{l}H{h}" for l in range(2) for h in range(4)]
