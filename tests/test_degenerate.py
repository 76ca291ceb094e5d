"""probes.degenerate: verdicts on hand-set heads whose patterns are derived on paper, NaN
confinement, whole-layer collapse, the training timeline from a hand-written metrics.jsonl,
and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from models import Transformer, TransformerConfig, build_model, get_preset
from probes import degenerate
from probes.common import ProbeInputError
from probes.degenerate import Thresholds, entropy_timeline, verdict

T = 8  # context; positional embeddings are the T one-hot rows scaled by sqrt(30), d_model = T
I = torch.eye(T)


def shift(k: int) -> torch.Tensor:
    """Ones at [j, j+k]: maps the one-hot e_j to e_{j+k}."""
    return torch.diag(torch.ones(T - k), k)


# (W_Q, W_K) per head kind. With x_i = sqrt(30) e_i: q_i . k_j = 30 * (W_Q W_K^T)[i, j].
HEADS = {
    "uniform": (torch.zeros(T, T), torch.zeros(T, T)),  # every score 0: row i uniform over i+1 keys
    "self": (I, I),  # 30 [j == i]
    "previous": (I, shift(1)),  # x_j W_K = sqrt(30) e_{j+1}: 30 [j == i-1]
    "sink": (torch.zeros(T, T).index_fill(1, torch.tensor([0]), 1.0), I * (torch.arange(T) == 0)),  # 30 [j == 0]
    "two_back": (I, shift(2)),  # 30 [j == i-2]: row 1 sees no such key, stays [1/2, 1/2]
}


def toy_model(layers: list[list[str]]) -> Transformer:
    """Zero weights except W_pos and the named heads; W_O = 0 and zero MLPs keep the residual at
    sqrt(30) e_i in every layer, so each layer's patterns are exactly the ones on paper."""
    cfg = TransformerConfig(d_vocab=5, n_ctx=T, d_model=T, n_layers=len(layers), n_heads=len(layers[0]),
                            d_head=T, d_mlp=4, norm="none", attn_scale="none", residual=True)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.W_pos.copy_(math.sqrt(30.0) * I)
        for block, kinds in zip(model.blocks, layers):
            for head, kind in zip(block.attention.heads, kinds):
                head.W_Q.copy_(HEADS[kind][0])
                head.W_K.copy_(HEADS[kind][1])
    return model


def tokens(batch: int = 3) -> torch.Tensor:
    return torch.randint(0, 5, (batch, T), generator=torch.Generator().manual_seed(0))


KINDS = ["uniform", "self", "previous", "sink", "two_back"]


@pytest.fixture(scope="module")
def five_heads():
    return degenerate.run(toy_model([KINDS]), tokens())


def test_verdicts_of_hand_set_heads(five_heads):
    assert five_heads.verdicts == [["uniform", "self", "previous", "sink", "collapsed"]]


def test_evidence_derived_on_paper(five_heads):
    ev = {k: v[0] for k, v in five_heads.evidence.items()}  # layer 0: name -> [head]
    harmonic = sum(1 / (i + 1) for i in range(T))  # H_8 = 2.717857
    # uniform: normalised entropy 1; max prob = first = diag = subdiag = mean_{i=1..7} 1/(i+1)
    assert ev["normalized_entropy"][0] == pytest.approx(1.0, abs=1e-6)
    for name in ("max_prob", "first_mass", "diag_mass", "subdiag_mass"):
        assert ev[name][0] == pytest.approx((harmonic - 1) / (T - 1), abs=1e-6)
    assert ev["sink_score"][0] == pytest.approx(harmonic / T, abs=1e-6)  # row 0 counted, as in Gu et al.
    # one-hot heads: entropy 0, all mass on the diagonal / sub-diagonal / first column
    for h, name in ((1, "diag_mass"), (2, "subdiag_mass"), (3, "first_mass")):
        assert ev["entropy"][h] == pytest.approx(0.0, abs=1e-6)
        assert ev["normalized_entropy"][h] == pytest.approx(0.0, abs=1e-6)
        assert ev[name][h] == pytest.approx(1.0, abs=1e-6)
    assert ev["sink_score"][3] == pytest.approx(1.0, abs=1e-6)
    # two back: row 1 is [1/2, 1/2] (ln 2 nats, normalised 1); rows 2..7 one-hot on i-2
    assert ev["entropy"][4] == pytest.approx(math.log(2) / T, abs=1e-6)
    assert ev["normalized_entropy"][4] == pytest.approx(1 / 7, abs=1e-6)
    assert ev["max_prob"][4] == pytest.approx(6.5 / 7, abs=1e-6)
    assert ev["first_mass"][4] == pytest.approx(1.5 / 7, abs=1e-6)  # row 1 half, row 2 all
    assert ev["diag_mass"][4] == pytest.approx(0.5 / 7, abs=1e-6)
    assert ev["nonfinite_rows"] == [0] * 5 and ev["weights_finite"] == [True] * 5
    assert ev["sink_score"][4] == pytest.approx(2.5 / T, abs=1e-6)  # rows 0, 1 (half), 2
    # sink heads (score > 0.3): sink, uniform (H_8/8 = 0.340: short windows inflate the literature's
    # score, which counts row 0) and two back (0.3125); not self or previous (1/8)
    assert five_heads.sink_rate == pytest.approx(3 / 5)


def test_whole_layer_collapse():
    collapsed = degenerate.run(toy_model([["self", "previous", "sink", "two_back"]]), tokens())
    assert collapsed.collapsed_layers == [True]
    mixed = degenerate.run(toy_model([["self", "previous", "sink", "two_back"],
                                      ["self", "uniform", "sink", "two_back"]]), tokens())
    assert mixed.collapsed_layers == [True, False]


def test_nan_in_last_layer_query_is_confined_to_that_head():
    """NaN in W_Q of layer 1 head 2 makes that head's q, scores and pattern NaN. Layer 0 and the
    other heads of layer 1 read the residual *before* layer 1 writes, so their patterns, and every
    number reported for them, are exactly those of the model without the NaN."""
    kinds = [["uniform", "self", "previous", "sink"]] * 2
    clean = degenerate.run(toy_model(kinds), tokens())
    model = toy_model(kinds)
    with torch.no_grad():
        model.blocks[1].attention.heads[2].W_Q[0, 0] = float("nan")
    broken = degenerate.run(model, tokens())
    assert broken.verdicts == [["uniform", "self", "previous", "sink"], ["uniform", "self", "diverged", "sink"]]
    assert broken.evidence["nonfinite_rows"][1][2] == 3 * T
    assert broken.evidence["weights_finite"][1] == [True, True, False, True]
    for name, grid in broken.evidence.items():
        for l, h in [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 3)]:
            assert grid[l][h] == clean.evidence[name][l][h], (name, l, h)
    out = broken.to_dict()
    assert out["evidence"]["entropy"][1][2] is None and out["verdicts"][1][2] == "diverged"
    json.dumps(out, allow_nan=False)


def test_nan_in_value_weights_is_diverged_though_the_pattern_is_finite():
    model = toy_model([["uniform", "self"], ["uniform", "self"]])
    with torch.no_grad():
        model.blocks[1].attention.heads[0].W_V[3, 1] = float("nan")
    result = degenerate.run(model, tokens())
    assert result.verdicts == [["uniform", "self"], ["diverged", "self"]]
    assert result.evidence["nonfinite_rows"][1] == [0, 0]


def test_nan_in_an_early_layer_poisons_every_later_head():
    model = toy_model([["uniform", "self"], ["uniform", "self"]])
    with torch.no_grad():
        model.blocks[0].attention.heads[0].W_Q[0, 0] = float("nan")
    result = degenerate.run(model, tokens())
    assert result.verdicts == [["diverged", "self"], ["diverged", "diverged"]]


def test_verdict_precedence_and_thresholds():
    base = dict(entropy=1.0, normalized_entropy=0.5, max_prob=0.5, first_mass=0.1, diag_mass=0.1,
                subdiag_mass=0.1, sink_score=0.1, nonfinite_rows=0, weights_finite=True)
    assert verdict(base) == "healthy"
    assert verdict({**base, "normalized_entropy": 0.98}) == "uniform"
    assert verdict({**base, "normalized_entropy": 0.98}, Thresholds(uniform_entropy=0.99)) == "healthy"
    assert verdict({**base, "max_prob": 0.95}) == "collapsed"
    assert verdict({**base, "max_prob": 0.95, "subdiag_mass": 0.95}) == "previous"
    assert verdict({**base, "max_prob": 0.95, "diag_mass": 0.95}) == "self"
    assert verdict({**base, "first_mass": 0.6}) == "sink"  # most mass, not one-hot: still a sink
    assert verdict({**base, "first_mass": 0.95, "weights_finite": False}) == "diverged"
    assert verdict({**base, "max_prob": float("nan")}) == "diverged"
    with pytest.raises(ValueError, match="sink_mass"):
        Thresholds(sink_mass=1.5)


def test_restricted_report_and_bridge():
    from transformer_lens import TransformerBridge
    bridge = TransformerBridge.boot_native({"n_layers": 2, "d_model": 32, "n_heads": 4, "d_head": 8,
                                            "d_mlp": 64, "d_vocab": 50, "n_ctx": 16, "act_fn": "gelu",
                                            "normalization_type": "LN", "seed": 0})
    result = degenerate.run(bridge, torch.randint(0, 50, (2, 16)), layer=1, head=3)
    assert result.layers == [1] and result.heads == [3] and len(result.verdicts) == 1
    assert result.verdicts[0][0] in degenerate.VERDICTS
    assert result.evidence["weights_finite"] == [[True]]  # stacked W_Q.. of the bridge were read
    with pytest.raises(ProbeInputError, match="one token"):
        degenerate.run(bridge, torch.randint(0, 50, (2, 1)))


# ---------------------------------------------------------------- training timeline

H16 = math.lgamma(17) / 16  # uniform entropy over a 16-token context: 1.91699 nats


def metrics_records():
    nan = None  # NaN is written as null by our JSON helpers
    return [
        {"step": 0, "attn_entropy": {"0": [1.9, 1.9], "1": [1.0, 1.0]}},
        {"step": 50, "train_loss": 3.0},  # no attention entropy logged: skipped
        {"step": 100, "attn_entropy": {"0": [1.0, 0.1], "1": [1.0, 1.88]}},
        {"step": 200, "attn_entropy": {"0": [0.05, 1.2], "1": [nan, 1.89]}},
        {"step": 300, "attn_entropy": {"0": [0.003, 1.3], "1": [nan, 1.9]}},
    ]


def test_timeline_from_hand_written_metrics():
    tl = entropy_timeline(metrics_records(), n_ctx=16)
    # collapse threshold 0.1 * 1.917 = 0.192; uniform 0.97 * 1.917 = 1.859
    assert tl.collapsed == [[200, None], [None, None]]  # L0H1 dipped at 100 but recovered
    assert tl.uniform == [[None, None], [None, 100]]  # L0 started uniform and left it
    assert tl.diverged == [[None, None], [200, None]]
    assert (tl.steps, tl.first_step, tl.last_step) == (4, 0, 300)
    assert tl.uniform_nats == pytest.approx(H16)
    assert "L0H0 collapsed from step 200" in tl.format()


def test_timeline_takes_int_keys_and_skips_a_malformed_record_instead_of_stopping(caplog):
    records = [{"step": 1, "attn_entropy": {0: [0.003], 1: [1.0]}},
               {"step": 2, "attn_entropy": [[0.002], [float("nan")]]},  # a list, not layers -> heads
               {"step": 3, "attn_entropy": ["bad", None]},  # stopped the whole timeline before
               {"step": 4, "attn_entropy": {"0": ["0.003"], "1": [1.0]}},  # a string, not a number
               {"step": 5, "attn_entropy": {"a": [1.0]}},  # stopped it too ("keys must be layer numbers")
               {"step": 6, "attn_entropy": {"0": [0.002], "1": [None]}}]
    tl = entropy_timeline(records, n_ctx=16)
    assert tl.collapsed == [[1], [None]] and tl.diverged == [[None], [6]]
    assert (tl.steps, tl.skipped) == (2, 4) and "2 logged steps (1..6; 4 malformed records skipped)" in tl.format()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned[1] == "timeline: skipping the record at step 3 ('attn_entropy' must map layers to " \
                        "per-head lists, got ['bad', None])"
    assert len(warned) == 4 and "step 5 ('attn_entropy' has layers ['a'], not those of layers numbered from 0 (0))" in warned[3]


# ---------------------------------------------------------------- CLI

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
PRESET = "transformer4_rms_small"
N_LAYERS, N_HEADS = 2, 2  # the shape of metrics_records(): a record must fit the run's model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from models.checkpoint import save_snapshot, snapshot_name
    from models.tokenizers import CharTokenizer
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = build_model(get_preset(PRESET, d_vocab=tok.vocab_size, n_layers=N_LAYERS, n_heads=N_HEADS))
    run = tmp_path_factory.mktemp("runs") / "run"
    run.mkdir()
    save_snapshot(run / snapshot_name(300), model, tok, step=300)
    lines = [json.dumps(r) for r in metrics_records()]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_cli_json_with_timeline(run_dir, capsys):
    assert degenerate.main(["--ckpt", str(run_dir), "--text", TEXT, "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["verdicts"]) == N_LAYERS and len(out["verdicts"][0]) == N_HEADS
    assert set(out["evidence"]) == set(degenerate.EVIDENCE)
    assert out["timeline"]["collapsed"] == [[200, None], [None, None]]
    assert out["thresholds"]["sink_score"] == 0.3


def test_cli_run_dir_without_input_prints_the_timeline(run_dir, capsys):
    assert degenerate.main(["--ckpt", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "L1H0 diverged from step 200" in out and "L1H1 uniform from step 100" in out


def test_cli_human_table(run_dir, capsys):
    assert degenerate.main(["--ckpt", str(run_dir / "step_000300"), "--text", TEXT, "--sink-mass", "0.6"]) == 0
    out = capsys.readouterr().out
    assert "verdicts:" in out and "whole-layer collapse" in out and "timeline" not in out


@pytest.mark.parametrize("extra, message", [
    (["--text", ""], "empty"),
    (["--text", "~~"], "~"),
    (["--text", TEXT, "--layer", str(N_LAYERS)], f"layer {N_LAYERS} is out of range"),
    (["--text", TEXT, "--head", str(N_HEADS)], f"head {N_HEADS} is out of range"),
    (["--text", TEXT, "--collapse-entropy", "2"], "argument --collapse-entropy: 2 is not a number in [0, 1]"),
])
def test_cli_bad_input_is_one_line_and_exit_2(run_dir, capsys, extra, message):
    assert degenerate.main(["--ckpt", str(run_dir), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_cli_snapshot_without_input_is_an_error(run_dir, capsys):
    assert degenerate.main(["--ckpt", str(run_dir / "step_000300")]) == 2
    assert "--text" in capsys.readouterr().err


@pytest.mark.parametrize("collapse, uniform", [(5.0, 0.97), (0.5, 0.4), (-0.1, 0.9), (0.1, 1.5)])
def test_timeline_thresholds_out_of_range_are_refused(collapse, uniform):
    with pytest.raises(ProbeInputError, match="timeline thresholds"):
        degenerate.entropy_timeline([], 8, collapse=collapse, uniform=uniform)


@pytest.mark.parametrize("bad", [
    {"step": 250, "attn_entropy": [[1, 2], [3, 4]]},  # a list, not layers -> heads
    {"step": 250, "attn_entropy": {"7": [1.0, 1.0]}},  # layer 7 of a 2-layer model
    {"step": 250, "attn_entropy": {"0": [1.0] * 9, "1": [1.0] * 9}},  # 9 values for 2 heads
])
def test_cli_a_malformed_record_leaves_the_answer_as_on_the_clean_run(run_dir, tmp_path, capsys, bad):
    import shutil

    copy = shutil.copytree(run_dir, tmp_path / "bad")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (copy / "metrics.jsonl").write_text("\n".join(lines[:4] + [json.dumps(bad)] + lines[4:]) + "\n")
    answers = []
    for run in (run_dir, copy):
        assert degenerate.main(["--ckpt", str(run), "--json"]) == 0
        answers.append(json.loads(capsys.readouterr().out)["timeline"])
    assert answers[1].pop("skipped") == 1 and answers[0].pop("skipped") == 0
    assert answers[1] == answers[0]
    assert degenerate.main(["--ckpt", str(copy)]) == 0
    out = capsys.readouterr().out
    assert "over 4 logged steps (0..300; 1 malformed record skipped)" in out and "L0H0 collapsed from step 200" in out
