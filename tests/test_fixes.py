"""The doctor's fixes as training options: QK-norm (`--set qk_norm=rms|layer`), the z-loss
(`--z-loss COEF`) and weight decay on the unembedding alone (`--unembed-weight-decay`), each with
an answer derived on paper on a tiny model, and the doctor naming the exact flag."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from models import build_model, get_preset
from models.checkpoint import load_checkpoint, save_snapshot
from models.config import config_from_dict
from models.loss import lm_loss, lm_loss_and_z
from probes import diagnose
from test_diagnose import finding, write_run
from train.config import build_optimizer

TINY = dict(d_vocab=11, n_ctx=8, d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, attn_scale="sqrt_d_head")


def tiny(qk_norm: str = "none", seed: int = 0, **fields):
    torch.manual_seed(seed)
    cfg = get_preset("transformer4_rms_small").replace(**{**TINY, "qk_norm": qk_norm, **fields})
    return build_model(cfg).double().eval()


def patterns(model, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    _, cache = model.run_with_cache(tokens)
    return cache["blocks.0.attn.hook_pattern"], cache["blocks.0.attn.hook_attn_scores"]


def blow_up_qk(model, factor: float) -> None:
    """Multiply every head's q and k projection by `factor` (the packed q|k columns of W_QKV)."""
    attn = model.blocks[0].attention
    with torch.no_grad():
        attn.W_QKV[:, : 2 * attn.cfg.d_attn] *= factor


# ------------------------------------------------------------------ QK-norm


def test_qk_norm_is_a_validated_config_field_that_old_configs_lack():
    with pytest.raises(ValueError, match="qk_norm"):
        tiny("batch")
    old = tiny().cfg.to_dict()
    del old["qk_norm"]  # a snapshot saved before the field existed
    assert config_from_dict(old).qk_norm == "none"


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_qk_norm_bounds_every_score_and_ignores_the_scale_of_q_and_k(kind):
    """With q and k normalised per head (gain 1), ||q|| = ||k|| = sqrt(d_head) (a layer norm's
    output also has mean 0 and rms 1), so |q.k| <= d_head and |score| = |q.k| / sqrt(d_head) <=
    sqrt(d_head), however large W_Q and W_K grow; and multiplying both by c changes nothing but eps
    (1e-12 here, so that it changes nothing measurable)."""
    tokens = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    model = tiny(kind, norm_eps=1e-12)
    before, _ = patterns(model, tokens)
    blow_up_qk(model, 1000.0)
    after, scores = patterns(model, tokens)
    visible = scores[torch.isfinite(scores)]
    assert visible.abs().max() <= math.sqrt(8) * (1 + 1e-9)
    assert torch.allclose(after, before, rtol=0, atol=1e-6)
    plain = tiny("none")
    plain_before, _ = patterns(plain, tokens)
    blow_up_qk(plain, 1000.0)
    plain_after, _ = patterns(plain, tokens)
    assert (plain_after - plain_before).abs().max() > 0.1  # without it, the softmax saturates


def test_hook_q_sees_the_normalised_q_and_both_attention_paths_agree():
    model = tiny("rms")
    tokens = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.blocks[0].attention.q_norm.gamma.copy_(torch.linspace(0.5, 2.0, 8))
    _, cache = model.run_with_cache(tokens)
    q, normalized = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.q_norm.hook_normalized"]
    assert torch.allclose(q, normalized * torch.linspace(0.5, 2.0, 8).double())
    assert torch.allclose(normalized.pow(2).mean(-1), torch.ones(2, 8, 2, dtype=torch.float64), atol=1e-4)
    model.set_attn_impl("fused")
    fused = model(tokens)
    model.set_attn_impl("explicit")
    assert torch.allclose(fused, model(tokens), rtol=0, atol=1e-10 * fused.abs().max().item())


def test_a_snapshot_records_qk_norm_and_loads_with_the_same_logits(tmp_path):
    from models.tokenizers import CharTokenizer

    model = tiny("rms").float()
    tokenizer = CharTokenizer.from_text("abcdefghijk")
    save_snapshot(tmp_path / "step_000000", model, tokenizer)
    assert json.loads((tmp_path / "step_000000" / "config.json").read_text())["model"]["qk_norm"] == "rms"
    snap = load_checkpoint(tmp_path / "step_000000")
    tokens = torch.tensor([tokenizer.encode("abcabc")])
    assert torch.equal(snap.model(tokens), model(tokens))


# ------------------------------------------------------------------ z-loss


class FixedLogits(torch.nn.Module):
    """A 'model' whose logits are a parameter: the loss's arithmetic alone."""

    cfg = type("cfg", (), {"family": "transformer"})()

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits)

    def forward(self, tokens):
        return self.logits.expand(tokens.shape[0], -1, -1)


def test_z_loss_is_the_mean_squared_log_partition_function_and_its_gradient():
    """Position 0: logits (0, 0) -> log Z = ln 2; position 1: (ln 3, 0) -> Z = 4, log Z = ln 4.
    mean log^2 Z = (ln^2 2 + ln^2 4) / 2 = 5/2 ln^2 2; d(log^2 Z)/dlogits = 2 log Z softmax."""
    logits = torch.tensor([[[0.0, 0.0], [math.log(3), 0.0]]], dtype=torch.float64)
    model = FixedLogits(logits)
    block = torch.tensor([[0, 1, 0]])  # targets 1, 0
    ce, log_z_sq = lm_loss_and_z(model, block)
    assert log_z_sq.item() == pytest.approx(2.5 * math.log(2) ** 2, rel=1e-12)
    assert ce.item() == pytest.approx((math.log(2) + math.log(4 / 3)) / 2, rel=1e-12)
    assert ce.item() == pytest.approx(lm_loss(model, block).item(), rel=1e-15)
    log_z_sq.backward()
    log_z = torch.tensor([math.log(2), math.log(4)], dtype=torch.float64)[:, None]
    by_hand = 2 * log_z * logits[0].softmax(-1) / 2  # the mean over 2 positions
    assert torch.allclose(model.logits.grad[0], by_hand, rtol=1e-12)


def test_training_with_z_loss_logs_its_term_apart_from_the_cross_entropy(tmp_path):
    from train.loop import batch_seed, main
    from train.data import block_len, load_corpus, sample_blocks

    text = tmp_path / "t.txt"
    text.write_text("the king and the queen shall not be what thou art.\n" * 40)
    out = tmp_path / "z"
    assert main(["--preset", "transformer4_rms_small", "--data", str(text), "--out", str(out), "-q",
                 "--steps", "1", "--batch-size", "4", "--log-every", "1", "--eval-every", "1",
                 "--z-loss", "0.5", "--seed", "7"]) == 0
    record = next(r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["step"] == 1)
    snap = load_checkpoint(out / "step_000000")  # the weights step 1's loss was taken on
    corpus = load_corpus(text, "char", 0.1, tokenizer=snap.tokenizer)
    seed = batch_seed(7, 0, 0, 0)
    block = sample_blocks(corpus.train, 4, block_len(snap.model.cfg), torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ce, log_z_sq = lm_loss_and_z(snap.model.train(), block)  # dropout 0: train mode = eval mode
    assert record["train_loss"] == pytest.approx(ce.item(), rel=1e-5)  # the cross-entropy alone
    assert record["z_loss"] == pytest.approx(0.5 * log_z_sq.item(), rel=1e-5)
    assert json.loads((out / "step_000001" / "config.json").read_text())["train_config"]["z_loss"] == 0.5


# ------------------------------------------------------------------ weight decay on the unembedding


def test_unembed_weight_decay_gets_its_own_group_and_decays_w_out_alone():
    """AdamW with zero gradients moves nothing but the decoupled decay: w <- w (1 - lr wd)."""
    model = tiny(unembed="separate").float()
    tc = {"optimizer": "adamw", "lr": 0.1, "betas": [0.9, 0.999], "weight_decay": 0.01,
          "unembed_weight_decay": 0.5}
    optimizer = build_optimizer(model, tc, torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert torch.allclose(model.W_out, before["W_out"] * (1 - 0.1 * 0.5))
    assert torch.allclose(model.blocks[0].attention.W_O, before["blocks.0.attention.W_O"] * (1 - 0.1 * 0.01))
    assert torch.equal(model.blocks[0].rms1.gamma, before["blocks.0.rms1.gamma"])  # 1-D: no decay
    with pytest.raises(ValueError, match="separate unembedding"):
        build_optimizer(tiny(unembed="tied"), tc, torch.device("cpu"))


# ------------------------------------------------------------------ the doctor names the flag


def growing(steps: int = 12) -> list[dict]:
    return [{"step": s, "val_loss": 3.0, "attn_logit_max": {"0": [1.5 ** s]}, "logit_max": 3.0 * 1.5 ** s}
            for s in range(steps)]


def test_the_doctor_names_the_exact_flags_for_logit_growth(tmp_path):
    d = diagnose.run(write_run(tmp_path / "plain", growing()))
    assert "--set qk_norm=rms" in finding(d, "attn_logit_growth").fix
    out = finding(d, "output_logit_growth").fix
    assert "--z-loss 1e-4" in out and "--unembed-weight-decay 0.1" in out
    normed = diagnose.run(write_run(tmp_path / "normed", growing(), model={"qk_norm": "rms"}))
    assert "--set qk_norm" not in finding(normed, "attn_logit_growth").fix  # it has it already


def test_a_monitored_nanogpt_run_is_told_its_own_words(tmp_path):
    run = write_run(tmp_path / "mine", growing())
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "source": "monitor", "trainer": "nanogpt"}))
    d = diagnose.run(run)
    assert "--set" not in finding(d, "attn_logit_growth").fix
    assert "CausalSelfAttention" in finding(d, "attn_logit_growth").fix
    assert "logsumexp" in finding(d, "output_logit_growth").fix


def test_a_tuned_lens_saved_before_qk_norm_existed_still_matches_its_model():
    """The config hash leaves out an added field at its "as before" value, and only then."""
    from probes.lens.tuned_file import config_sha256

    import dataclasses

    cfg = tiny().cfg
    old = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "qk_norm"}  # the config before the field
    assert config_sha256(cfg) == config_sha256(old)
    assert config_sha256(cfg.replace(qk_norm="rms")) != config_sha256(cfg)
