"""Activation health: dead and saturated units on hand-set MLPs, statistics against a full cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from llama_kit import llama, llama_tokens  # noqa: F401  (fixture: a bias-free Llama-family bridge)

from models import MLPConfig, build_model, get_preset
from probes import activations

REPO = Path(__file__).resolve().parent.parent


def char_mlp(act_fn: str = "relu", seed: int = 0):
    torch.manual_seed(seed)
    return build_model(MLPConfig(d_vocab=20, n_ctx=4, d_embed=8, d_hidden=16, n_hidden_layers=2,
                                 act_fn=act_fn)).double()


def tokens(batch: int = 4, pos: int = 12, vocab: int = 20, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def test_relu_layer_with_bias_minus_100_is_all_dead():
    model = char_mlp("relu")
    with torch.no_grad():
        model.mlp.net[0].bias.fill_(-100.0)  # pre-activation < 0 everywhere in hidden layer 0
    layers = activations.run(model, tokens()).layers
    assert [l["name"] for l in layers] == ["mlp.hook_post", "mlp.hook_post_1"]
    assert layers[0]["dead_fraction"] == 1.0 and layers[0]["saturated_fraction"] == 1.0
    assert layers[0]["mean"] == 0.0 and layers[0]["std"] == 0.0


def test_half_the_units_dead_by_hand():
    model = char_mlp("relu")
    with torch.no_grad():
        model.mlp.net[0].weight.zero_()
        model.mlp.net[0].bias.copy_(torch.tensor([-1.0, 2.0] * 8))  # every odd unit outputs 2
    layer = activations.run(model, tokens(), grads=False).layers[0]
    assert layer["dead_fraction"] == 0.5 and layer["saturated_fraction"] == 0.5
    assert layer["mean"] == pytest.approx(1.0) and layer["std"] == pytest.approx(1.0)


def test_tanh_fed_huge_inputs_is_saturated():
    model = char_mlp("tanh")
    with torch.no_grad():
        model.mlp.net[0].weight.mul_(1e4)
        model.mlp.net[0].bias.fill_(1e6)  # every input far past the flat tail: tanh = 1
    layer = activations.run(model, tokens()).layers[0]
    assert layer["saturated_fraction"] == 1.0 and layer["dead_fraction"] == 1.0
    assert layer["mean"] == pytest.approx(1.0) and layer["std"] == pytest.approx(0.0, abs=1e-12)
    healthy = activations.run(char_mlp("tanh"), tokens()).layers[0]
    assert healthy["saturated_fraction"] < 0.2 and healthy["dead_fraction"] == 0.0


def test_statistics_agree_with_a_full_cache_and_autograd():
    torch.manual_seed(0)
    model = build_model(get_preset("transformer4_rms_small")).double()
    ids = tokens(3, 17, 96)
    result = activations.run(model, ids, batch_size=8)
    assert all(p.grad is None for p in model.parameters())  # run() leaves the model's grads alone
    names = [l["name"] for l in result.layers]
    assert names[:2] == ["blocks.0.mlp.hook_post", "blocks.0.mlp.hook_post_1"] and len(names) == 8
    cache: dict[str, torch.Tensor] = {}

    def keep(t, hook):
        t.retain_grad()
        cache[hook.name] = t

    with model.hooks(fwd_hooks=[(n, keep) for n in names]):
        logits = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    for layer in result.layers:
        post = cache[layer["name"]]
        assert layer["mean"] == pytest.approx(post.mean().item(), rel=1e-9)
        assert layer["std"] == pytest.approx(post.std(unbiased=False).item(), rel=1e-6)
        assert layer["dead_fraction"] == pytest.approx((post.flatten(0, 1) <= 0).all(0).double().mean().item())
        assert layer["grad_mean"] == pytest.approx(post.grad.mean().item(), rel=1e-6, abs=1e-15)
        assert sum(layer["hist"]["counts"]) == post.numel()


def test_compact_form_and_json():
    result = activations.run(char_mlp(), tokens(), grads=False)
    compact = result.compact()
    assert set(compact) == {"mlp.hook_post", "mlp.hook_post_1"}
    assert set(compact["mlp.hook_post"]) == {"dead", "saturated", "nonfinite", "mean", "std"}
    json.dumps(result.to_dict())


def test_cli_and_bad_input(tmp_path):
    from models.checkpoint import save_snapshot
    from models.tokenizers import CharTokenizer

    snap = tmp_path / "snap"
    model = build_model(get_preset("char_mlp_small").replace(d_vocab=5))
    save_snapshot(snap, model, CharTokenizer.from_text("abcde"))
    run = lambda *a: subprocess.run([sys.executable, "-m", "probes.activations", "--ckpt", str(snap), *a],
                                    capture_output=True, text=True, cwd=REPO)
    proc = run("--text", "abcdeabcdeabcdeabcde", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [l["name"] for l in json.loads(proc.stdout)["layers"]] == ["mlp.hook_post"]
    table = run("--text", "abcdeabcdeabcde").stdout
    assert "mlp.hook_post" in table and "dead" in table
    for args, message in [(("--text", "abcz"), "z"), (("--text", "abcde", "--saturation", "2"), "saturation")]:
        proc = run(*args)
        assert proc.returncode == 2 and proc.stderr.startswith("error:") and message in proc.stderr, proc.stderr


def test_nan_activations_are_reported_as_such_not_as_dead_units():
    model = char_mlp("relu")
    with torch.no_grad():
        model.mlp.net[0].bias[:4] = float("nan")  # four units diverged
    layer = activations.run(model, tokens(), grads=False).layers[0]
    assert layer["dead_fraction"] is None and layer["saturated_fraction"] is None
    assert layer["nonfinite_fraction"] == pytest.approx(4 / 16)
    assert "25% of activations are NaN or inf" in activations.ActivationsResult([layer]).format()


def test_a_gated_silu_mlp_on_a_bias_free_bridge_agrees_with_its_cache(llama):  # noqa: F811
    """SwiGLU: hook_pre is the gate's input to SiLU, hook_post = SiLU(gate) * up. A bridge names
    its hooks by their aliases (`mlp.hook_post` fires as `mlp.out.hook_in`): they still count."""
    ids = llama_tokens(3, 16)
    result = activations.run(llama, ids, batch_size=2)
    assert [l["name"] for l in result.layers] == ["blocks.0.mlp.hook_post", "blocks.1.mlp.hook_post"]
    with torch.no_grad():
        _, cache = llama.run_with_cache(ids[:, :-1])
    for layer in result.layers:
        pre, post = cache[layer["name"].replace("post", "pre")], cache[layer["name"]]  # [batch pos d_mlp]
        assert layer["act_fn"] == "silu" and layer["units"] == 64
        assert layer["mean"] == pytest.approx(post.mean().item(), rel=1e-5, abs=1e-6 * post.abs().max().item())
        assert layer["std"] == pytest.approx(post.std(unbiased=False).item(), rel=1e-5)
        assert layer["dead_fraction"] == pytest.approx((pre.flatten(0, 1) <= 0).all(0).float().mean().item())
        assert layer["saturated_fraction"] == pytest.approx((pre < activations.SILU_FLAT).float().mean().item())
        assert layer["grad_std"] > 0


def test_a_silu_gate_fed_zero_is_dead_and_below_minus_six_is_flat(llama):  # noqa: F811
    gate = llama.original_model.layers[0]._original_component.mlp._original_component.gate._original_component
    saved = gate.weight.detach().clone()
    try:
        with torch.no_grad():
            gate.weight.zero_()  # SiLU(0) = 0: no unit ever active, none on the flat tail
        layer = activations.run(llama, llama_tokens(2, 16), grads=False).layers[0]
        assert (layer["dead_fraction"], layer["saturated_fraction"], layer["mean"]) == (1.0, 0.0, 0.0)
        assert activations.saturated_mask(torch.tensor([-10.0, -5.0, 0.0]), None, "silu").tolist() == \
            [True, False, False]
    finally:
        with torch.no_grad():
            gate.weight.copy_(saved)
