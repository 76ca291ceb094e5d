"""The MLP LM: it slides its window over the tokens (one window is the series' model), and its
hooks and dims.
"""

from __future__ import annotations

import pytest
import torch
from models_kit import SMALL_MLP, build, rand_tokens

from models import get_preset


# --------------------------------------------------------------------------------------------
# the MLP LM
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SMALL_MLP)
def test_mlp_lm_slides_its_window(name):
    cfg = get_preset(name)
    model = build(name)
    pos = cfg.n_ctx + 5
    toks = rand_tokens(cfg, batch=3, pos=pos)
    out = model(toks)
    assert out.shape == (3, pos - cfg.n_ctx + 1, cfg.d_vocab)
    windows = torch.cat([model(toks[:, i:i + cfg.n_ctx]) for i in range(pos - cfg.n_ctx + 1)], dim=1)
    torch.testing.assert_close(out, windows, atol=1e-5, rtol=1e-5)
    # one window is the series' model: embeddings concatenated in order, then the MLP
    first = toks[:, :cfg.n_ctx]
    series_style = model.mlp(model.embedding(first).view(3, -1))
    torch.testing.assert_close(model(first)[:, 0], series_style, atol=1e-5, rtol=1e-5)


def test_mlp_lm_hooks_and_dims():
    cfg = get_preset("token_mlp_small")
    model = build(cfg)
    toks = rand_tokens(cfg, pos=cfg.n_ctx + 2)
    _, cache = model.run_with_cache(toks)
    shapes = {k: tuple(v.shape) for k, v in cache.items()}
    want = {"hook_embed": (2, cfg.n_ctx + 2, cfg.d_embed), "hook_window": (2, 3, cfg.d_input)}
    for i in range(cfg.n_hidden_layers):
        suffix = "" if i == 0 else f"_{i}"
        want[f"mlp.hook_pre{suffix}"] = want[f"mlp.hook_post{suffix}"] = (2, 3, cfg.d_hidden)
    assert shapes == want
    assert not any("attn" in k for k in model.hook_dict)
    # the MLP family has no layers of attention: no n_layers / n_heads (probes treat that as 0)
    assert not hasattr(cfg, "n_layers") and not hasattr(cfg, "n_heads")
    assert model.cfg.n_ctx == cfg.n_ctx and model.cfg.d_vocab == cfg.d_vocab
