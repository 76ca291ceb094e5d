"""`--set unembed_init_scale=S`, the doctor's fix for a high initial loss (`init_loss_high`): the
layer that makes the logits starts S times smaller with its bias at zero, so at init the logits
are exactly S x (what they were, minus the bias) and the loss is within 2 S max|logit| of
ln(vocab) (|CE(z) - ln V| <= 2 max|z| for any logits z: log-sum-exp and the picked logit each move
by at most max|z| from their values at z = 0)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from models import build_model, get_preset
from models.config import config_from_dict
from probes import diagnose
from test_diagnose import finding, write_run
from train.args import parse_sets

SCALE = 0.01


def twins(preset: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    cfg = get_preset(preset)
    torch.manual_seed(0)
    plain = build_model(cfg).eval()  # eval: the GPT's dropout off
    torch.manual_seed(0)
    return plain, build_model(cfg.replace(unembed_init_scale=SCALE)).eval()


def logit_bias(model: torch.nn.Module) -> torch.Tensor:
    """The bias added to the logits at init (zero where the model has none)."""
    cfg = model.cfg
    if cfg.family == "mlp":
        return model.mlp.net[-1].bias
    if cfg.unembed == "mlp":
        return model.blocks[-1].mlp.net[-1].bias
    return model.b_out if cfg.unembed_bias else torch.zeros(cfg.d_vocab)


@pytest.mark.parametrize("preset", ["transformer4_small", "tiny_shakespeare_gpt_small", "attn1_noscale_small",
                                    "char_mlp_small"])
def test_the_logits_start_scaled_and_without_their_bias(preset):
    plain, small = twins(preset)
    ids = torch.randint(0, plain.cfg.d_vocab, (2, plain.cfg.n_ctx), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = SCALE * (plain(ids) - logit_bias(plain))  # [batch pos d_vocab]
        assert torch.allclose(small(ids), expected, rtol=1e-5, atol=1e-7)
        assert not logit_bias(small).any()
    others = {k for k in plain.state_dict() if not torch.equal(plain.state_dict()[k], small.state_dict()[k])}
    assert len(others) <= 2  # only the logit layer's weight and bias differ


def test_the_initial_loss_lands_near_ln_vocab():
    plain, small = twins("transformer4_small")  # the series' init: its loss starts far above ln V
    ids = torch.randint(0, 65, (4, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before, after = plain(ids[:, :-1]), small(ids[:, :-1])  # [batch pos d_vocab]
    loss = lambda z: torch.nn.functional.cross_entropy(z.flatten(0, 1), ids[:, 1:].flatten()).item()  # noqa: E731
    ln_v = math.log(plain.cfg.d_vocab)
    assert loss(before) > ln_v + 1.0  # the premise: init_loss_high's kind of start
    assert abs(loss(after) - ln_v) <= 2 * after.abs().max().item()  # the bound above
    assert abs(loss(after) - ln_v) < 0.05


def test_the_field_is_validated_parsed_and_old_configs_read_as_one():
    cfg = get_preset("transformer4_small")
    assert parse_sets(cfg, ["unembed_init_scale=0.01"]) == {"unembed_init_scale": 0.01}
    old = {k: v for k, v in cfg.to_dict().items() if k != "unembed_init_scale"}  # saved before it
    assert config_from_dict(old).unembed_init_scale == 1.0
    for bad in (0, -1.0, math.nan, math.inf, True, "small"):
        with pytest.raises(ValueError, match="unembed_init_scale must be a finite number > 0"):
            cfg.replace(unembed_init_scale=bad)
    with pytest.raises(ValueError, match="a tied one is the embedding"):
        get_preset("gpt2_124m_small").replace(unembed_init_scale=0.01)


def test_the_doctor_names_the_flag_or_the_trainers_words(tmp_path):
    records = [{"step": 0, "val_loss": 8.3}, {"step": 10, "val_loss": 4.0}, {"step": 20, "val_loss": 3.5}]
    fix = finding(diagnose.run(write_run(tmp_path / "ours", records)), "init_loss_high").fix
    assert "--set unembed_init_scale=0.01" in fix
    run = write_run(tmp_path / "nano", records)
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "source": "monitor", "trainer": "nanogpt"}))
    fix = finding(diagnose.run(run), "init_loss_high").fix
    assert "--set" not in fix and "lm_head.weight scaled by 0.01" in fix


def test_dead_relus_are_offered_gelu_as_a_flag(tmp_path):
    layers = {"mlp.hook_post": {"dead": 0.3, "saturated": 0.95}}  # 30% of the units never fire
    records = [{"step": s, "train_loss": 3.0 - s / 100, "activations": layers} for s in range(0, 60, 10)]
    run = write_run(tmp_path / "dead", records, model={"family": "mlp", "act_fn": "relu"})
    assert "(GELU: --set act_fn=gelu)" in finding(diagnose.run(run), "dead_units").fix
    assert get_preset("char_mlp_small").replace(**parse_sets(get_preset("char_mlp_small"), ["act_fn=gelu"])).act_fn == "gelu"
