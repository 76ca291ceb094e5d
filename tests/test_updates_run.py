"""`probes.updates.run`: one optimizer step on a copy of the model. g is the gradient computed by
hand, u follows SGD's and Adam's formulas, the caller's model and gradients stay bitwise unchanged;
a bias-free TransformerLens bridge gets rows under its own names.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from llama_kit import llama, llama_tokens  # noqa: F401 - fixtures
from torch import nn

from models import build_model, get_preset
from models.packed_heads import named_rows
from probes import updates
from probes.update_parts.report import parameter_group


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
