"""One packed q/k/v parameter per layer under the series' per-head names (`models.packed_heads`):
head views that write through, state dicts in the series' names both ways (with the usual errors
for a missing or misshapen head), one g/w/u row per head, and optimizer state saved with
per-head parameters carried over exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from models import build_model, get_preset
from models.packed_heads import named_rows, pack_optimizer_state
from train.config import build_optimizer
from train.run_lock import check_optimizer_state


def build(name: str = "gpt2_124m_small", seed: int = 0):
    torch.manual_seed(seed)
    return build_model(get_preset(name, dropout=0.0))


def test_head_views_are_the_packed_columns_and_write_through():
    model = build()
    attn, cfg = model.blocks[1].attention, model.cfg
    d = cfg.d_head
    for j in range(cfg.n_heads):
        for which, kind in enumerate("QKV"):
            cols = slice((which * cfg.n_heads + j) * d, (which * cfg.n_heads + j + 1) * d)
            assert torch.equal(getattr(attn.heads[j], f"W_{kind}"), attn.W_QKV[:, cols])
            assert torch.equal(getattr(attn.heads[j], f"b_{kind}"), attn.b_QKV[cols])
    with torch.no_grad():
        attn.heads[2].W_K.fill_(0.5)
    k_cols = slice((cfg.n_heads + 2) * d, (cfg.n_heads + 3) * d)
    assert bool((attn.W_QKV[:, k_cols] == 0.5).all()) and not bool((attn.W_QKV[:, :d] == 0.5).all())
    assert torch.equal(attn.stacked("W_K")[2], attn.heads[2].W_K)
    no_bias = build("tiny_shakespeare_gpt_small").blocks[0].attention
    assert not hasattr(no_bias.heads[0], "b_Q") and hasattr(no_bias.heads[0], "W_Q")
    with pytest.raises(AttributeError, match="no parameter 'W_X'"):
        no_bias.heads[0].W_X


def test_state_dict_holds_separate_per_head_copies_and_loads_back():
    model = build()
    state = model.state_dict()
    assert not any(key.endswith(("W_QKV", "b_QKV")) for key in state)
    head = state["blocks.0.attention.heads.3.W_V"]
    assert head.shape == (model.cfg.d_model, model.cfg.d_head) and head.is_contiguous()
    assert head.untyped_storage().data_ptr() != model.blocks[0].attention.W_QKV.untyped_storage().data_ptr()
    assert list(state) == [k for k in state if k in set(model.series_parameters())] + \
        [k for k in state if k not in set(model.series_parameters())]  # parameters, then buffers
    other = build(seed=1)
    assert not torch.equal(other.blocks[0].attention.W_QKV, model.blocks[0].attention.W_QKV)
    other.load_state_dict(state)
    for (name, a), b in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(a, b), name


def test_a_missing_or_misshapen_head_is_named_in_the_error():
    model = build()
    state = model.state_dict()
    del state["blocks.1.attention.heads.0.W_K"]
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*blocks\.1\.attention\.heads\.0\.W_K"):
        build(seed=1).load_state_dict(state)
    state = model.state_dict()
    state["blocks.0.attention.heads.2.b_Q"] = torch.zeros(3)
    with pytest.raises(RuntimeError, match=r"size mismatch for blocks\.0\.attention\.heads\.2\.b_Q.*\(3,\)"):
        build(seed=1).load_state_dict(state)


def test_a_partial_load_keeps_the_other_heads_columns():
    model, other = build(), build(seed=1)
    kept = other.blocks[0].attention.heads[1].W_Q.clone()
    state = model.state_dict()
    del state["blocks.0.attention.heads.1.W_Q"]
    result = other.load_state_dict(state, strict=False)
    assert result.missing_keys == ["blocks.0.attention.heads.1.W_Q"] and not result.unexpected_keys
    assert torch.equal(other.blocks[0].attention.heads[1].W_Q, kept)
    assert torch.equal(other.blocks[0].attention.heads[1].W_K, model.blocks[0].attention.heads[1].W_K)


def test_gradients_split_into_one_row_per_head():
    model = build()
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    model(tokens).logsumexp(-1).mean().backward()
    grads = named_rows(model, lambda p: p.grad)
    assert list(grads) == list(model.series_parameters())
    packed = model.blocks[0].attention.W_QKV.grad
    d, n = model.cfg.d_head, model.cfg.n_heads
    assert torch.equal(grads["blocks.0.attention.heads.1.W_V"], packed[:, (2 * n + 1) * d:(2 * n + 2) * d])


def adamw(module: nn.Module):
    tc = {"optimizer": "adamw", "lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1}
    return build_optimizer(module, tc, torch.device("cpu"))


def test_optimizer_state_saved_with_per_head_parameters_carries_over_exactly():
    """The same AdamW step on the packed model and on per-head parameters (the layout before
    the packing, in its order and groups): the translated state equals the packed optimizer's."""
    model = build()
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 12), generator=torch.Generator().manual_seed(1))
    model(tokens).logsumexp(-1).mean().backward()
    per_head = nn.ParameterList([nn.Parameter(t.detach().clone()) for t in model.series_parameters().values()])
    for p, g in zip(per_head, named_rows(model, lambda p: p.grad).values()):
        p.grad = g.clone()
    old, new = adamw(per_head), adamw(model)
    old.step(), new.step()
    for p, view in zip(per_head, model.series_parameters().values()):
        assert torch.equal(p, view)  # the two layouts took the same step
    translated = pack_optimizer_state(old.state_dict(), new, model)
    check_optimizer_state(translated, new, "optimizer.pt")  # fits the packed model now
    expected = new.state_dict()
    assert translated["param_groups"] == expected["param_groups"]
    assert set(translated["state"]) == set(expected["state"])
    for i, entry in expected["state"].items():
        for key, value in entry.items():
            assert torch.equal(translated["state"][i][key], value), (i, key)
    fresh = adamw(model)
    fresh.load_state_dict(translated)
    assert pack_optimizer_state(expected, new, model) is expected  # state that fits is left alone


def test_loading_a_snapshot_runs_no_python_reference_ops():
    """A checkpoint load stays on torch's C++ kernels: a clone of the meta skeleton's per-head
    views ran torch's Python reference ops, whose first use imports sympy (0.2-0.4 s of every
    load in the app and the CLIs). Checked in a fresh interpreter, where the import is visible."""
    code = ("import sys; from pathlib import Path; from models.checkpoint import list_snapshots, load_checkpoint\n"
            "snap = load_checkpoint(list_snapshots(Path('checkpoints/shakespeare_gpt'))[-1])\n"
            "assert sum(p.numel() for p in snap.model.parameters()) > 0\n"
            "print(sorted(m for m in ('sympy', 'torch._dynamo', 'torch._refs') if m in sys.modules))")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "sympy" not in out.stdout and "torch._dynamo" not in out.stdout, out.stdout
