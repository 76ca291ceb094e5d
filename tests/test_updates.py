"""g / w / u: hand-computed single-parameter cases, the series' table format, offline recompute."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn

from models import build_model, get_preset
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
