"""What a newcomer's own GPTs (tests/gpt_kit: HandLlama, HandEinsumGPT), trained with the Monitor,
get from the g/w/u grouping, the doctor and the app: groups by the layout the Monitor found, the
slow-Q/K rule on `layers.N.mix.to_q`, a spike that came back, a run that ended above its start,
the initial loss before any update, dead-unit advice that reads the activation, and the app's MLP,
throughput and default-text views."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from app_kit import open_app
from chart_kit import specs
from gpt_kit import TEXT, HandEinsumGPT, HandLlama, train_run

from probes import diagnose
from probes.update_parts.report import UpdateReport
from tests.test_diagnose import write_run

CODE = Path(__file__).resolve().parent / "gpt_kit" / "einsum.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("newcomer")
    train_run(HandLlama(), root / "llama", steps=2, save_every=1)
    train_run(HandEinsumGPT(), root / "einsum", steps=3, save_every=2)
    train_run(HandEinsumGPT(gelu_module=False), root / "einsum_fn", steps=2)
    return root


def block_groups(block: str, attn: dict[str, str], norms: list[str], mlp: list[str]) -> dict[str, str]:
    return {**{f"{block}.{n}": "norms" for n in norms}, **{f"{block}.{n}": g for n, g in attn.items()},
            **{f"{block}.{n}": "MLP" for n in mlp}}


def test_groups_follow_the_layout_the_monitor_found(runs):
    qk, vo = "attention Q/K", "attention V/O"
    llama = {"tok.weight": "embeddings", "norm_f.gain": "norms"}  # tied: the table is named once
    einsum = {"emb.tok.weight": "embeddings", "emb.where.weight": "embeddings", "final.weight": "norms",
              "final.bias": "norms", "out.weight": "unembedding", "out.bias": "unembedding"}
    for b in (0, 1):
        llama |= block_groups(f"layers.{b}", {"attn.wqkv.q.weight": qk, "attn.wqkv.k.weight": qk,
                                              "attn.wqkv.v.weight": vo, "attn.wo.weight": vo},
                              ["pre_attn.gain", "pre_mlp.gain"], ["mlp.gate.weight", "mlp.up.weight", "mlp.down.weight"])
        einsum |= block_groups(f"layers.{b}", {"mix.to_q.weight": qk, "mix.to_k.weight": qk, "mix.to_v.weight": vo,
                                               "mix.to_out.weight": vo, "mix.to_out.bias": vo},
                               ["n1.weight", "n1.bias", "n2.weight", "n2.bias"],
                               ["ff.0.weight", "ff.0.bias", "ff.2.weight", "ff.2.bias"])
    from probes.updates import from_run
    for name, expected in (("llama", llama), ("einsum", einsum)):
        info = json.loads((runs / name / "run.json").read_text())
        assert info["model"]["parameter_groups"] == expected, name
        report = from_run(runs / name).reports[-1]
        assert report.group_of == {n: expected[n] for n in report.parameters}, name  # none is "other"
    assert UpdateReport.from_table({"emb.tok.weight": {"u": 1e-3, "w": 1.0}}).group_of["emb.tok.weight"] == "other"


def gwu_rows(qk_u: float, mlp_u: float) -> dict:
    row = lambda u: {"g": 1e-3, "w": 0.1, "u": u, "u_nominal": u}  # noqa: E731
    return {name: row(qk_u if "to_q" in name or "to_k" in name else mlp_u)
            for b in (0, 1) for name in (f"layers.{b}.mix.to_q.weight", f"layers.{b}.mix.to_k.weight",
                                         f"layers.{b}.ff.0.weight", f"layers.{b}.ff.2.weight")}


def test_slow_qk_runs_on_the_groups_the_layout_gave(tmp_path):
    records = [{"step": s, "train_loss": 3.0 - s / 100, "gwu": gwu_rows(1e-4, 2e-3)} for s in range(10, 110, 10)]
    groups = {n: "attention Q/K" if "to_" in n else "MLP" for n in gwu_rows(1, 1)}
    found = diagnose.run(write_run(tmp_path / "laid", records, model={"parameter_groups": groups}))
    slow = next(f for f in found.findings if f.code == "slow_qk")
    assert slow.evidence["gap_orders"] == pytest.approx(math.log10(2e-3 / 1e-4), rel=1e-9)  # exact but for rounding
    assert slow.where == ("layers.0 Q/K", "layers.1 Q/K")  # the model's own names, not blocks.N
    by_names = diagnose.run(write_run(tmp_path / "names", records))  # no layout: to_q is no name we know
    assert "slow_qk" not in [f.code for f in by_names.findings]


def losses(values: list[float], **extra) -> list[dict]:
    return [{"step": i, "train_loss": v, **extra} for i, v in enumerate(values)]


def divergence(run: Path) -> diagnose.Finding | None:
    return next((f for f in diagnose.run(run).findings if f.code == "divergence"), None)


@pytest.mark.parametrize("values, steps, severity, title", [
    ([4.4, 30.0, 117.7, 20.0, 3.5, 3.2, 3.1], 7, "warning",  # the Llama at lr 1: up 113 nats and back
     "the train loss spiked: 4.40 at step 0 -> 117.70 at step 2, back to 3.50 by step 4 (it ended at 3.10)"),
    ([4.61, 3.0, 8.0, 30.0, 52.7], 5, "failed",  # the einsum GPT: steps 0-4 of steps=5 is the whole run
     "the run diverged: the train loss ended at 52.70 (step 4), above its first value 4.61"),
    ([4.4, 4.0, 6.9, 3.5, 3.2, 3.1, 3.0], 7, None, ""),  # 2.5 nats up: a bump, under the 3-nat line
])
def test_a_loss_that_spikes_and_returns_or_ends_above_its_start(tmp_path, values, steps, severity, title):
    found = divergence(write_run(tmp_path / "r", losses(values), train={"steps": steps}))
    if severity is None:
        assert found is None
        return
    assert found is not None and found.severity == severity and found.title.startswith(title), found


def test_the_initial_loss_is_the_train_loss_before_any_update(tmp_path):
    # ln(100) = 4.605: the train loss at step 0 is at uniform; the val loss after the first update is not
    records = [{"step": 0, "train_loss": 4.61, "val_loss": 9.5}] + losses([4.0, 3.5, 3.2])[1:]
    assert not [f for f in diagnose.run(write_run(tmp_path / "a", records, model={"d_vocab": 100})).findings
                if f.code == "init_loss_high"]
    high = [{"step": 0, "train_loss": 8.0, "val_loss": 4.7}] + records[1:]
    found = next(f for f in diagnose.run(write_run(tmp_path / "b", high, model={"d_vocab": 100})).findings
                 if f.code == "init_loss_high")
    assert found.evidence["initial_loss"] == 8.0 and "train loss at step 0, before any update" in found.title
    val_only = [{"step": 0, "val_loss": 8.0}] + records[1:]
    found = next(f for f in diagnose.run(write_run(tmp_path / "c", val_only, model={"d_vocab": 100})).findings
                 if f.code == "init_loss_high")
    assert found.evidence["measured"] == "the val loss at step 0"


@pytest.mark.parametrize("act_fn, advises_gelu", [("relu", True), ("gelu", False), (None, False)])
def test_dead_unit_advice_reads_the_recorded_activation(tmp_path, act_fn, advises_gelu):
    acts = {"layers.0.ff.1": {"dead": 0.4, "saturated": 0.1}, "layers.1.ff.1": {"dead": 0.0, "saturated": 0.0}}
    records = [{"step": s, "train_loss": 3.0 - s / 100, "activations": acts} for s in range(0, 80, 10)]
    found = diagnose.run(write_run(tmp_path / "d", records, model={"act_fn": act_fn}))
    dead = next(f for f in found.findings if f.code == "dead_units")
    assert ("GELU" in dead.fix) == advises_gelu, dead.fix


def test_the_mlp_charts_name_each_layer_and_say_why_nothing_was_measured(runs, monkeypatch):
    at = open_app(monkeypatch, [runs], "dynamics", run="einsum")
    (_, frames), = specs(at, "dead MLP units")
    dead = next(f for f in frames if "dead share" in f.columns)
    assert sorted(dead["layer"].unique()) == ["block 0 ff.1", "block 1 ff.1"]  # was one series, "1"
    said = " ".join(c.value for c in at.caption)
    assert "tokens per second: this run logged no tokens seen" in said and "tokens_per_step" in said
    assert not specs(at, "tokens per second")  # no empty chart
    at = open_app(monkeypatch, [runs], "dynamics", run="einsum_fn")
    said = " ".join(c.value for c in at.caption)
    assert "Dead and saturated MLP units: not measured: the non-linearity is not a module (a function call)" in said


def test_the_overview_says_tokens_seen_were_not_counted(runs, monkeypatch):
    at = open_app(monkeypatch, [runs], run="einsum")
    shown = {m.label: m.value for m in at.metric}
    assert shown["tokens seen"] == "not logged", shown


def test_with_the_code_the_sidebar_opens_on_a_text_the_vocabulary_holds(runs, monkeypatch):
    monkeypatch.setenv("SCRATCHSCOPE_MODEL_CODE", f"{CODE}:HandEinsumGPT")
    at = open_app(monkeypatch, [runs], "attention", run="einsum")
    text = at.sidebar.text_area(key="text").value
    assert text and set(text) <= set(TEXT)  # the saved sample's text, not the default with its "?"
    for page in ("attention", "lens"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception and not at.error, (page, [e.value for e in at.error])


def test_layer_labels_keep_layers_apart():
    from app.series import layer_labels

    assert layer_labels(["layers.0.ff.1", "layers.1.ff.1"]) == {"layers.0.ff.1": "block 0 ff.1",
                                                                "layers.1.ff.1": "block 1 ff.1"}
    assert layer_labels(["blocks.2.mlp.hook_post"]) == {"blocks.2.mlp.hook_post": "block 2 post"}
    both = ["encoder.0.ff.1", "decoder.0.ff.1"]  # one short name for two layers: their full names
    assert layer_labels(both) == {n: n for n in both}


def test_the_doctor_says_why_the_monitor_measured_no_activations(runs):
    said = diagnose.run(runs / "einsum_fn").not_checked["dead_units"]
    assert said == "not measured: the non-linearity is not a module (a function call) (run.json)", said


def test_the_layout_agrees_with_the_names_where_the_names_know():
    """Tutorial, packed-qkv and nanochat layouts (tests/gpt_kit: tutorial.py, nanochat.py), whose
    names the name patterns were written for: the layout gives each parameter the same group, and
    where a name says nothing (SplitGPT's attention output `out`) the layout still knows it: V/O."""
    import gpt_kit as kit

    from probes.update_parts.groups import parameter_groups
    from probes.update_parts.report import parameter_group
    for cls in (kit.PerHeadGPT, kit.BatchedGPT, kit.SplitGPT, kit.ChatGPT):
        groups = parameter_groups(cls(), kit.tokens())
        named = {n: parameter_group(n) for n in groups}
        told_apart = {n for n, g in named.items() if g == "other"}
        assert {n: g for n, g in groups.items() if n not in told_apart} == \
            {n: g for n, g in named.items() if n not in told_apart}, cls.__name__
        assert {groups[n] for n in told_apart} <= {"attention V/O"}, cls.__name__
    assert parameter_groups(kit.SplitGPT(), kit.tokens())["h.1.attn.out.weight"] == "attention V/O"


def test_a_spike_the_guard_rewound_is_told_by_its_rescue_not_twice(tmp_path):
    records = losses([4.4, 30.0, 117.7, 3.5, 3.2, 3.1, 3.0])
    records[2]["rescue"] = {"action": "rewind", "restored_step": 0}
    found = divergence(write_run(tmp_path / "g", records, train={"steps": 7}))
    assert found is None or "spiked" not in found.title, found
