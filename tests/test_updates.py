"""g / w / u: hand-computed single-parameter cases, the series' table format, offline recompute."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn
from llama_kit import llama, llama_tokens  # noqa: F401  (fixture: a bias-free Llama-family bridge)

from models import build_model, get_preset
from models.packed_heads import named_rows
from probes.updates import (format_gwu, gwu_from_snapshots, gwu_table, rms, snapshot_params,
                        strip_wrapper_prefix)

# One row of the series' own training log (series-blog.txt, the SGD transformer run).
SERIES_ROW = "    blocks.0.attention.heads.0.W_Q      g=5.5e-05 w=5.8e-02 u=4.8e-05"
SERIES_COLUMNS = re.compile(r"^    (\S+) +g=(\d\.\de[+-]\d\d) w=(\d\.\de[+-]\d\d) u=(\d\.\de[+-]\d\d)")


class OneParam(nn.Module):
    def __init__(self, values: list[float]):
        super().__init__()
        self.W = nn.Parameter(torch.tensor(values, dtype=torch.float64))


class Wrapper(nn.Module):
    """Stands in for DistributedDataParallel / torch.compile: the model under `module`."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.module = inner


def one_step(model: nn.Module, optimizer: torch.optim.Optimizer, grad: list[float], lr: float):
    param = next(model.parameters())
    param.grad = torch.tensor(grad, dtype=param.dtype)
    before = snapshot_params(model)
    optimizer.step()
    return gwu_table(model, before, lr)


def test_rms_by_hand():
    assert rms(torch.tensor([3.0, 4.0])) == pytest.approx(math.sqrt(12.5))
    assert rms(torch.zeros(0)) == 0.0


def test_sgd_u_equals_lr_g_over_w_exactly():
    # w = [1, -2, 2], g = [0.3, 0.3, -0.6], lr = 0.1: plain SGD moves w by exactly -lr * g, so
    # u = rms(lr g) / rms(w_after) = lr * g / w = u_nominal (w measured after the step).
    lr, w0, g = 0.1, [1.0, -2.0, 2.0], [0.3, 0.3, -0.6]
    model = OneParam(w0)
    row = one_step(model, torch.optim.SGD(model.parameters(), lr=lr), g, lr)["W"]
    w_after = [a - lr * b for a, b in zip(w0, g)]  # [0.97, -2.03, 2.06]
    rms_g = math.sqrt(sum(x * x for x in g) / 3)  # sqrt(0.18)
    rms_w = math.sqrt(sum(x * x for x in w_after) / 3)  # sqrt(9.3054 / 3)
    assert row["g"] == pytest.approx(rms_g, rel=1e-12)
    assert row["w"] == pytest.approx(rms_w, rel=1e-12)
    assert row["u"] == pytest.approx(lr * rms_g / rms_w, rel=1e-12)  # 0.0240896
    assert row["u"] == pytest.approx(row["u_nominal"], rel=1e-12)
    assert row["u"] == pytest.approx(0.0240896, rel=1e-5)


def test_adam_first_step_moves_every_entry_by_lr():
    # Adam's first step: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps), i.e.
    # lr * sign(g) up to a relative eps / |g| <= 1e-8 / 0.1 = 1e-7 per entry. Hence
    # u = lr * rms(sign g) / rms(w_after) = lr / rms(w_after), whatever the size of g,
    # while the series' nominal lr * g / w scales with g. float64 keeps rounding at 1e-13.
    lr, w0, g = 1e-3, [1.0, -2.0, 2.0, 0.5], [0.1, -3.0, 0.2, 40.0]
    model = OneParam(w0)
    row = one_step(model, torch.optim.Adam(model.parameters(), lr=lr, eps=1e-8), g, lr)["W"]
    w_after = [w - lr * math.copysign(1.0, x) for w, x in zip(w0, g)]
    rms_w = math.sqrt(sum(x * x for x in w_after) / 4)
    assert row["w"] == pytest.approx(rms_w, rel=1e-6)
    assert row["u"] == pytest.approx(lr / rms_w, rel=1e-6)
    rms_g = math.sqrt(sum(x * x for x in g) / 4)
    assert row["u_nominal"] == pytest.approx(lr * rms_g / rms_w, rel=1e-12)
    assert row["u_nominal"] / row["u"] == pytest.approx(rms_g, rel=1e-6)  # ~20x off for Adam


def test_zero_weights_give_undefined_u():
    model = OneParam([0.0, 0.0])
    row = one_step(model, torch.optim.SGD(model.parameters(), lr=0.1), [0.0, 0.0], 0.1)["W"]
    assert row == {"g": 0.0, "w": 0.0, "u": None, "u_nominal": None}


def test_parameter_without_grad_has_no_g():
    model = OneParam([1.0, 1.0])
    before = snapshot_params(model)
    row = gwu_table(model, before, lr=0.1)["W"]
    assert row["g"] is None and row["u_nominal"] is None and row["u"] == 0.0 and row["w"] == 1.0


def test_wrapped_model_keeps_series_names_and_sgd_identity():
    torch.manual_seed(0)
    inner = build_model(get_preset("transformer4_rms_small")).double()
    model = Wrapper(Wrapper(inner))  # like DDP(torch.compile(model)) naming: module.module.*
    tokens = torch.randint(0, inner.cfg.d_vocab, (2, 8))
    inner(tokens).logsumexp(-1).mean().backward()
    before = snapshot_params(model)
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    table = gwu_table(model, before, lr=0.5)
    assert list(table) == list(inner.series_parameters())  # one row per head, the series' order
    assert "blocks.0.attention.heads.0.W_Q" in table and "blocks.1.rms2.gamma" in table
    for name, row in table.items():
        assert row["u"] == pytest.approx(row["u_nominal"], rel=1e-9), name


def test_strip_wrapper_prefix():
    assert strip_wrapper_prefix("module._orig_mod.W_pos") == "W_pos"
    assert strip_wrapper_prefix("blocks.0.module.x") == "blocks.0.module.x"


def test_gwu_from_snapshots_by_hand():
    a = {"module.W": torch.tensor([1.0, -2.0, 2.0]), "module.idx": torch.tensor([1, 2])}
    b = {"W": torch.tensor([1.5, -2.0, 2.0]), "extra": torch.ones(2)}
    table = gwu_from_snapshots(a, b)
    assert list(table) == ["W"]  # ints and tensors missing from either side are skipped
    rms_b = math.sqrt((2.25 + 4 + 4) / 3)
    assert table["W"]["w"] == pytest.approx(rms_b)
    assert table["W"]["u"] == pytest.approx(math.sqrt(0.25 / 3) / rms_b)
    assert "g" not in table["W"]


def test_format_reproduces_the_series_row():
    table = {"blocks.0.attention.heads.0.W_Q": {"g": 5.5e-05, "w": 5.8e-02, "u": 4.8e-05,
                                                "u_nominal": 4.7e-05}}
    line = format_gwu(table)
    assert line.startswith(SERIES_ROW + " ")
    assert line.endswith("log10(u)=-4.3 u_nom=4.7e-05 slow")


def test_format_columns_band_flags_and_missing_values():
    table = {"W_pos": {"g": 2.4e-04, "w": 9.9e-01, "u": 1.2e-03, "u_nominal": 1.2e-05},
             "blocks.1.mlp.net.4.bias": {"g": 4.0e-03, "w": 1.8e-02, "u": 1.1e-02,
                                         "u_nominal": 1.1e-02},
             "b": {"g": 0.0, "w": 0.0, "u": None, "u_nominal": None},
             "offline": {"w": 1.0, "u": 1e-3}}
    lines = format_gwu(table).splitlines()
    assert len(lines) == 4
    for line, name in zip(lines, table):
        assert line.index("g=") == 40  # 4 spaces + a 36-wide name column, as in the series
        if table[name]["u"] is not None and "g" in table[name]:
            match = SERIES_COLUMNS.match(line)
            assert match and match.group(1) == name
    assert lines[0].endswith("log10(u)=-2.9 u_nom=1.2e-05")  # in band: no flag
    assert lines[1].endswith(" fast")
    assert lines[2].endswith("u=- log10(u)=- u_nom=-")
    assert "g=- w=1.0e+00 u=1.0e-03" in lines[3]


# --------------------------------------------------------------------------- probes.updates sources

import copy  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from probes import updates  # noqa: E402
from probes.update_parts.report import parameter_group  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def double_model(preset: str = "transformer4_rms_small", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(get_preset(preset)).double()


def toy_tokens(batch: int = 3, pos: int = 9, vocab: int = 96, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def my_grads(model: nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The mean next-token cross-entropy over every position, differentiated by hand here."""
    work = copy.deepcopy(model)
    logits = work(tokens[:, :-1])  # [batch pos-1 vocab]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return named_rows(work, lambda p: p.grad)  # per head, as the series names them


def test_run_sgd_u_equals_lr_g_over_w_and_g_is_my_gradient():
    model, tokens, lr = double_model(), toy_tokens(), 0.05
    report = updates.run(model, tokens, "sgd", lr=lr)
    grads = my_grads(model, tokens)
    assert set(report.parameters) == set(grads)
    for name, row in report.parameters.items():
        g = grads[name].pow(2).mean().sqrt().item()
        assert row["g"] == pytest.approx(g, rel=1e-12)
        after = model.series_parameters()[name].detach() - lr * grads[name]
        assert row["w"] == pytest.approx(after.pow(2).mean().sqrt().item(), rel=1e-12)
        if row["u"] is not None:
            assert row["u"] == pytest.approx(lr * row["g"] / row["w"], rel=1e-9)
            assert row["u_nominal"] == pytest.approx(row["u"], rel=1e-9)
            assert row["log10_u"] == pytest.approx(math.log10(row["u"]))


def test_run_adam_matches_adams_formulas_by_hand():
    model, tokens, lr, eps = double_model(), toy_tokens(), 1e-3, 1e-8
    report = updates.run(model, tokens, "adam", lr=lr, betas=(0.9, 0.999), eps=eps)
    for name, grad in my_grads(model, tokens).items():
        m_hat = (1 - 0.9) * grad / (1 - 0.9)  # first step: bias correction undoes (1 - beta)
        v_hat = (1 - 0.999) * grad ** 2 / (1 - 0.999)
        before = model.series_parameters()[name].detach()
        after = before - lr * m_hat / (v_hat.sqrt() + eps)
        w = after.pow(2).mean().sqrt().item()
        expected_u = (after - before).pow(2).mean().sqrt().item() / w
        assert report.parameters[name]["u"] == pytest.approx(expected_u, rel=1e-9), name


def test_run_leaves_the_callers_model_and_gradients_bitwise_unchanged():
    model, tokens = double_model(), toy_tokens()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    updates.run(model, tokens, "adamw", lr=0.1)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, grads[n]), n


def test_run_accepts_an_optimizer_factory_and_refuses_bad_settings():
    model, tokens = double_model(), toy_tokens()
    report = updates.run(model, tokens, lambda params, lr: torch.optim.SGD(params, lr=lr), lr=0.01)
    assert report.source == "step" and report.lr == 0.01
    with pytest.raises(ValueError, match="unknown optimizer"):
        updates.run(model, tokens, "lion")
    with pytest.raises(ValueError, match="lr must be"):
        updates.run(model, tokens, lr=float("inf"))
    with pytest.raises(ValueError, match="too few tokens"):
        updates.run(model, tokens[:, :1])  # nothing to predict


def test_groups_spread_and_flags_by_hand():
    table = {"embedding.weight": {"g": 1.0, "w": 1.0, "u": 1e-5, "u_nominal": None},
             "blocks.0.attention.heads.0.W_Q": {"g": 1.0, "w": 1.0, "u": 1e-4, "u_nominal": None},
             "blocks.0.attention.heads.1.W_K": {"g": 1.0, "w": 1.0, "u": 1e-6, "u_nominal": None},
             "blocks.0.attention.W_O": {"g": 1.0, "w": 1.0, "u": 0.0, "u_nominal": None},
             "blocks.0.mlp.net.0.weight": {"g": 1.0, "w": 1.0, "u": 1e-1, "u_nominal": None},
             "blocks.0.rms1.gamma": {"g": None, "w": None, "u": None, "u_nominal": None},
             "W_out": {"g": float("nan"), "w": 1.0, "u": 1e-3, "u_nominal": None}}
    report = updates.UpdateReport.from_table(table, band=(-4.5, -2.0))
    groups = report.groups
    assert groups["attention Q/K"]["median_log10_u"] == pytest.approx(-5.0)  # median of -4 and -6
    assert groups["MLP"]["median_log10_u"] == pytest.approx(-1.0)
    assert groups["attention V/O"]["median_log10_u"] is None  # u = 0 has no log
    assert report.spread == pytest.approx(-1.0 - (-5.0))
    assert report.flags == {"embedding.weight": ["slow"], "blocks.0.attention.heads.1.W_K": ["slow"],
                            "blocks.0.attention.W_O": ["frozen"], "blocks.0.mlp.net.0.weight": ["fast"],
                            "blocks.0.rms1.gamma": ["non-finite"], "W_out": ["non-finite"]}
    data = report.to_dict()
    assert set(data["parameters"]["W_out"]) == {"g", "w", "u", "u_nominal", "log10_u"}
    with pytest.raises(ValueError, match="band"):
        updates.UpdateReport.from_table(table, band=(-2.0, -4.0))


@pytest.mark.parametrize("name, group", [
    ("W_pos", "embeddings"), ("embedding.weight", "embeddings"), ("embed.W_E", "embeddings"),
    ("blocks.3.attention.heads.2.W_K", "attention Q/K"), ("blocks.0.attn.b_Q", "attention Q/K"),
    ("blocks.1.attention.W_O", "attention V/O"), ("blocks.0.attn.W_V", "attention V/O"),
    ("blocks.0.mlp.net.4.bias", "MLP"), ("mlp.net.0.weight", "MLP"), ("blocks.0.mlp.W_in", "MLP"),
    ("blocks.2.rms2.gamma", "norms"), ("blocks.0.ln1.w", "norms"), ("ln_final.beta", "norms"),
    ("W_out", "unembedding"), ("unembed.W_U", "unembedding")])
def test_parameter_groups_for_our_names_and_transformer_lens_names(name, group):
    assert parameter_group(name) == group


@pytest.mark.parametrize("name, group", [
    # nanoGPT's GPT and Hugging Face GPT-2 (c_attn split into q|k|v rows by named_trainable)
    ("transformer.wte.weight", "embeddings"), ("transformer.wpe.weight", "embeddings"),
    ("transformer.h.0.attn.c_attn.q.weight", "attention Q/K"), ("transformer.h.0.attn.c_attn.k.bias", "attention Q/K"),
    ("transformer.h.0.attn.c_attn.v.weight", "attention V/O"), ("transformer.h.3.attn.c_proj.weight", "attention V/O"),
    ("transformer.h.0.mlp.c_fc.weight", "MLP"), ("transformer.h.0.mlp.c_proj.bias", "MLP"),
    ("transformer.h.1.ln_1.weight", "norms"), ("transformer.ln_f.bias", "norms"), ("lm_head.weight", "unembedding"),
    # other modules, by the names most libraries use (Llama-style)
    ("model.embed_tokens.weight", "embeddings"), ("model.layers.0.self_attn.q_proj.weight", "attention Q/K"),
    ("model.layers.0.self_attn.o_proj.weight", "attention V/O"), ("model.layers.0.mlp.gate_proj.weight", "MLP"),
    ("model.layers.0.input_layernorm.weight", "norms"), ("model.norm.weight", "norms"),
    ("encoder.mystery.weight", "other")])
def test_parameter_groups_for_nanogpt_hf_gpt2_and_other_modules(name, group):
    assert parameter_group(name) == group


def test_gpt2_packed_c_attn_becomes_q_k_v_rows_in_both_layouts():
    """nn.Linear keeps q|k|v as rows of its [3d d] weight, Conv1D as columns of [d 3d]: each third
    is that kind's projection, whichever the layout."""
    class Conv1D(nn.Module):  # transformers.pytorch_utils.Conv1D's layout: weight [in out]
        def __init__(self, d_in: int, d_out: int):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.randn(d_in, d_out)), nn.Parameter(torch.randn(d_out))

    for layer, dim in ((nn.Linear(4, 12), 0), (Conv1D(4, 12), 1)):
        model = nn.Module()
        model.attn = nn.Module()
        model.attn.c_attn = layer
        rows = updates.named_trainable(model)
        assert list(rows) == ["attn.c_attn.q.weight", "attn.c_attn.k.weight", "attn.c_attn.v.weight",
                              "attn.c_attn.q.bias", "attn.c_attn.k.bias", "attn.c_attn.v.bias"]
        for i, part in enumerate("qkv"):
            assert torch.equal(rows[f"attn.c_attn.{part}.weight"], layer.weight.narrow(dim, 4 * i, 4))
            assert torch.equal(rows[f"attn.c_attn.{part}.bias"], layer.bias[4 * i:4 * i + 4])


@pytest.fixture(scope="module")
def step_run(tmp_path_factory) -> Path:
    """A run logged and saved at every step, so snapshots and log can be compared."""
    from train.loop import main as train_main

    data = tmp_path_factory.mktemp("data") / "t.txt"
    data.write_text("the king and the queen shall not be what thou art.\n" * 60, encoding="utf-8")
    out = tmp_path_factory.mktemp("runs") / "r"
    assert train_main(["--preset", "transformer4_rms_small", "--data", str(data), "--out", str(out),
                       "-q", "--steps", "4", "--batch-size", "4", "--log-every", "1",
                       "--eval-every", "2", "--save-every", "1", "--optimizer", "sgd",
                       "--lr", "0.05", "--momentum", "0"]) == 0
    return out


def test_from_run_history_and_one_step(step_run):
    history = updates.from_run(step_run)
    assert history.steps == [1, 2, 3, 4]
    assert history.latest.step == 4 and history.at(2).step == 2
    rows = history.records()
    assert {r["step"] for r in rows} == {1, 2, 3, 4} and {"name", "group", "log10_u"} <= set(rows[0])
    assert len(history.group_records()) == 4 * len(history.latest.groups)
    with pytest.raises(ValueError, match="step 7 has no g/w/u record; logged steps: 1, 2, 3, 4"):
        updates.from_run(step_run, step=7)


def test_between_two_snapshots_equals_what_training_logged(step_run):
    logged = updates.from_run(step_run, step=3)
    offline = updates.between(step_run / "step_000002", step_run / "step_000003")
    assert set(offline.parameters) == set(logged.parameters)
    for name, row in offline.parameters.items():
        assert row["u"] == pytest.approx(logged.parameters[name]["u"], rel=1e-12), name
        assert row["w"] == pytest.approx(logged.parameters[name]["w"], rel=1e-12), name
    reverse = updates.between(step_run / "step_000003", step_run / "step_000002")
    assert reverse.parameters == offline.parameters  # the earlier snapshot is always `a`


def test_between_with_tokens_gives_g_and_the_sgd_identity(step_run):
    from models.checkpoint import load_checkpoint

    a = load_checkpoint(step_run / "step_000002")
    tokens = torch.tensor([a.tokenizer.encode("the king and the queen shall not be")])
    report = updates.between(a, step_run / "step_000003", tokens)
    assert report.lr == pytest.approx(0.05)
    for name, row in report.parameters.items():
        assert row["g"] is not None and row["g"] > 0, name


def test_between_refuses_snapshots_of_different_models(step_run, tmp_path):
    from models.checkpoint import save_snapshot
    from models.tokenizers import CharTokenizer

    other = tmp_path / "other"
    cfg = get_preset("transformer4_rms_small").replace(d_model=16, d_head=4)
    save_snapshot(other, build_model(cfg), CharTokenizer.from_text("abc"))
    with pytest.raises(ValueError, match="different models"):
        updates.between(step_run / "step_000001", other)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "probes.updates", *args], capture_output=True,
                          text=True, cwd=REPO)


def test_cli_table_json_history_and_between(step_run):
    out = cli("--ckpt", str(step_run)).stdout
    assert out.startswith("g / w / u at step 4 (run)")
    assert re.search(r"^    blocks\.0\.attention\.heads\.0\.W_Q +g=\S+ w=\S+ u=\S+", out, re.M)
    assert "groups (median log10 u):" in out and "attention Q/K" in out
    data = json.loads(cli("--ckpt", str(step_run), "--step", "2", "--json").stdout)
    assert data["step"] == 2 and data == json.loads(json.dumps(updates.from_run(step_run, 2).to_dict()))
    hist = json.loads(cli("--ckpt", str(step_run), "--history", "--json").stdout)
    assert hist["steps"] == [1, 2, 3, 4]
    between = json.loads(cli("--ckpt", str(step_run), "--between", "1", "2", "--json").stdout)
    assert between["source"] == "between" and between["step"] == 2
    one = json.loads(cli("--ckpt", str(step_run / "step_000004"), "--text", "the king shall",
                         "--optimizer", "adam", "--lr", "0.001", "--json").stdout)
    assert one["source"] == "step" and one["lr"] == 0.001


def test_cli_bad_input_is_one_line_and_exit_2(step_run, tmp_path):
    empty = tmp_path / "empty_run"
    (empty / "step_000000").mkdir(parents=True)
    truncated = tmp_path / "truncated"
    import shutil

    shutil.copytree(step_run, truncated)
    with open(truncated / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "gwu": {"W_pos": {"g": 1')  # a crash mid-write
    cases = [(("--ckpt", str(empty)), "no metrics.jsonl records"),
             (("--ckpt", str(step_run), "--step", "9"), "step 9 has no g/w/u record"),
             (("--ckpt", str(step_run), "--band", "-2", "-4"), "band"),
             (("--ckpt", str(tmp_path / "missing")), "")]
    for args, message in cases:
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
        assert message in proc.stderr
    proc = cli("--ckpt", str(truncated), "--history", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["steps"] == [1, 2, 3, 4]
    assert "truncated last line" in proc.stderr
    proc = cli("--ckpt", str(step_run / "step_000004"), "--json")  # a snapshot: one step on its run's text
    assert proc.returncode == 0 and json.loads(proc.stdout)["text"].endswith("t.txt (the run's data)")


def test_one_step_on_a_bias_free_bridge_names_and_groups_its_own_parameters(llama):  # noqa: F811
    """A TransformerBridge (no `family` in its cfg) wraps every module in `_original_component`:
    the rows carry the wrapped model's names, grouped, and plain SGD gives u = lr g / w."""
    report = updates.run(llama, llama_tokens(2, 16), "sgd", lr=0.01)
    groups = {name: parameter_group(name) for name in report.parameters}
    assert groups["tok_embed.weight"] == "embeddings" and groups["head.weight"] == "unembedding"
    assert groups["layers.0.attn.q.weight"] == "attention Q/K" and groups["layers.1.attn.o.weight"] == "attention V/O"
    assert groups["layers.0.mlp.gate.weight"] == "MLP" and groups["ln_out.weight"] == "norms"
    assert "other" not in groups.values() and len(groups) == 21  # 1 + 2 x 9 + 2
    for row in report.parameters.values():
        assert row["u"] == pytest.approx(row["u_nominal"], rel=1e-4)


def test_a_parameter_that_starts_at_zero_has_no_update_ratio_at_its_first_step():
    """A zero-initialised bias becomes the update itself: rms(delta) / rms(w) would read exactly 1
    whatever the step size (nanoGPT's and GPT-2's biases and LayerNorm betas at init), which the
    doctor read as 'updates far too fast at step 0'. It has no u; from the next step on it does."""
    model = nn.Sequential(nn.Linear(3, 2))
    with torch.no_grad():
        model[0].bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(2):
        model(torch.randn(4, 3)).pow(2).sum().backward()
        before = snapshot_params(model)
        opt.step()
        table = gwu_table(model, before, 1e-3)
        opt.zero_grad()
        if step == 0:
            assert table["0.bias"]["u"] is None and table["0.bias"]["u_nominal"] is None
            assert table["0.bias"]["w"] > 0 and table["0.weight"]["u"] is not None
        else:
            assert 0 < table["0.bias"]["u"] < 1
    zero = {"b": torch.zeros(2)}
    assert gwu_from_snapshots(zero, {"b": torch.ones(2)})["b"]["u"] is None
