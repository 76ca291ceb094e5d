"""The attention probes on any module, through the tap: on our models the tap gives the hook
points' numbers (one way to capture attention for every probe), and on models we never rebuilt
the probes agree with the pure functions applied to the models' own patterns (Hugging Face eager
`output_attentions=True`, the tutorial models' kept patterns)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gpt_kit import BatchedGPT, ChatGPT, PerHeadGPT, SdpaGPT, hf_pair, hf_patterns, own_patterns, tokens
from models import build_model, get_preset
from probes import degenerate, entropy, heads
from probes.common import ProbeInputError
from probes.sources import source_of


class Plain(nn.Module):
    """Our model behind a bare forward: no cfg, no hook points, so the probes take the tap (and the
    model its fused SDPA path, which the tap rebuilds)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner(ids)


@pytest.fixture(scope="module")
def ours():
    torch.manual_seed(1)
    model = build_model(get_preset("tiny_shakespeare_gpt_small")).eval()
    with torch.no_grad():  # sharper heads than at init, so the verdicts differ between heads
        for block in model.blocks:
            block.attention.W_QKV.mul_(30.0)
    return model


def grids_close(a, b, rtol: float = 1e-5) -> None:
    a, b = (torch.as_tensor(x, dtype=torch.float64) for x in (a, b))
    assert a.shape == b.shape
    assert float((a - b).abs().max()) <= rtol * max(float(b.abs().max()), 1e-12)


def test_tap_equals_hooks_on_our_model(ours):
    toks = torch.randint(0, ours.cfg.d_vocab, (5, 16), generator=torch.Generator().manual_seed(3))
    hooked, tapped = entropy.run(ours, toks, batch_size=2), entropy.run(Plain(ours), toks, batch_size=2)
    grids_close(tapped.entropy, hooked.entropy)
    grids_close(tapped.entropy_normalized, hooked.entropy_normalized)
    assert (tapped.tokens, tapped.windows) == (hooked.tokens, hooked.windows) == (80, 5)
    d_hooked, d_tapped = degenerate.run(ours, toks), degenerate.run(Plain(ours), toks)
    assert d_tapped.verdicts == d_hooked.verdicts and len({v for row in d_hooked.verdicts for v in row}) > 1
    for name in ("normalized_entropy", "max_prob", "first_mass", "diag_mass", "subdiag_mass", "sink_score"):
        grids_close(d_tapped.evidence[name], d_hooked.evidence[name])
    h_hooked, h_tapped = heads.run(ours, toks), heads.run(Plain(ours), toks)
    for name, grid in h_hooked.scores.items():
        grids_close(h_tapped.scores[name], grid)
    grids_close(entropy.layer_patterns(Plain(ours), toks[:1], 2), entropy.layer_patterns(ours, toks[:1], 2))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_probes_on_hf_sdpa_model_equal_eager_attentions(kind):
    sdpa, eager = hf_pair(kind)
    toks = tokens(3, 20)
    ref = hf_patterns(eager, toks)  # [batch head q k] per layer, Hugging Face's own
    got = entropy.run(sdpa, toks)
    grids_close(got.entropy, [entropy.series_entropy(p).tolist() for p in ref])
    grids_close(got.entropy_normalized, [entropy.normalized_entropy(p).mean(dim=(0, 2)).tolist() for p in ref])
    assert got.model == f"{type(sdpa).__name__}(n_layers=2, n_heads=4, n_ctx=64)"  # max_position_embeddings
    det = heads.detection_patterns(toks)["previous_token"]
    grids_close(heads.run(sdpa, toks).scores["previous_token"],
                [heads.mul_score(p, det).mean(0).tolist() for p in ref])


@pytest.mark.parametrize("cls", [PerHeadGPT, BatchedGPT, SdpaGPT, ChatGPT])
def test_probes_on_tutorial_models_equal_their_own_patterns(cls):
    torch.manual_seed(0)
    model = cls().eval()
    toks = tokens(2, 24)
    ref = own_patterns(model, toks)
    got = entropy.run(model, toks)
    grids_close(got.entropy, [entropy.series_entropy(p).tolist() for p in ref])
    assert source_of(model).dims == source_of(model, toks).dims and source_of(model).dims.n_ctx == 32
    verdicts = degenerate.run(model, toks)
    assert verdicts.evidence["max_prob"] is not None and verdicts.evidence["weights_finite"][0][0] is None
    grids_close(verdicts.evidence["first_mass"], [p[..., 1:, 0].mean(dim=(0, 2)).tolist() for p in ref])
    grids_close(entropy.layer_patterns(model, toks[:1], 1), ref[1][0])


def test_context_from_the_position_table_else_from_the_tokens():
    plain = Plain(build_model(get_preset("tiny_shakespeare_gpt_small")))  # no config, a 16-row W_pos
    dims = source_of(plain, tokens(1, 12)).dims
    assert dims.n_ctx == 16 and dims.n_layers == 4 and dims.d_vocab == 65
    rotary = ChatGPT()
    rotary.config = None  # rotary positions, no config: nothing names a context
    assert source_of(rotary, tokens(1, 12)).dims.n_ctx == 12


def test_a_model_without_attention_gets_one_line():
    mlp = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    for probe in (entropy.run, degenerate.run, heads.run):
        with pytest.raises(ProbeInputError, match="no attention call the tap can read") as err:
            probe(mlp, tokens(1, 6))
        assert "\n" not in str(err.value) and "cfg" not in str(err.value)
