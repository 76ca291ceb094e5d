"""Bad input to forward: tokens out of range or of the wrong type or shape, a sequence longer than
the context, an MLP LM given less than a full window: each a ValueError that names the problem.
"""

from __future__ import annotations

import pytest
import torch
from models_kit import build, rand_tokens

from models import get_preset


# --------------------------------------------------------------------------------------------
# bad input to forward
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["transformer2_small", "char_mlp_small"])
def test_bad_tokens_raise_value_error(name):
    cfg = get_preset(name)
    model = build(name)
    good = rand_tokens(cfg)
    bad_id = good.clone()
    bad_id[0, 3] = cfg.d_vocab
    with pytest.raises(ValueError, match=rf"token id {cfg.d_vocab} is outside the vocabulary \[0, {cfg.d_vocab}\)"):
        model(bad_id)
    bad_id[0, 3] = -1
    with pytest.raises(ValueError, match=r"token id -1 is outside the vocabulary"):
        model(bad_id)
    with pytest.raises(ValueError, match="integer ids, got dtype torch.float32"):
        model(good.float())
    with pytest.raises(ValueError, match="integer ids"):
        model(good > 3)
    with pytest.raises(ValueError, match=r"shape \[batch pos\], got \(2, 1, "):
        model(good.unsqueeze(1))
    with pytest.raises(ValueError, match="torch.Tensor"):
        model(good.tolist())
    # a 1-D sequence is one batch row; int32 ids are fine
    assert model(good[0]).shape[0] == 1
    torch.testing.assert_close(model(good.int()), model(good))


def test_too_long_sequence_names_the_context():
    cfg = get_preset("transformer2_small")
    model = build(cfg)
    with pytest.raises(ValueError, match=rf"sequence of {cfg.n_ctx + 1} tokens is longer than the "
                                         rf"model's context of {cfg.n_ctx}"):
        model(rand_tokens(cfg, pos=cfg.n_ctx + 1))
    with pytest.raises(ValueError, match="at least 1 token"):
        model(torch.zeros(2, 0, dtype=torch.long))


def test_mlp_lm_needs_a_full_window():
    cfg = get_preset("char_mlp_small")
    with pytest.raises(ValueError, match=rf"at least {cfg.n_ctx} token"):
        build(cfg)(rand_tokens(cfg, pos=cfg.n_ctx - 1))
