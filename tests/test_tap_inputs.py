"""The tap on models that are not plain attention LMs (issue 44, "The tap"): each gets the right answer
or one line in the project's own exception, never a traceback from inside the model.

- a router's softmax over as many experts as there are ids is not read as attention;
- weights on the meta device are refused at the source's one check;
- a forward that requires `attention_mask` is given one of ones; any other required argument is named;
- ids longer than a tutorial's position table are windowed to it (its rows are the context), and
  where nothing names the context the forward's own IndexError becomes one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt_kit import PerHeadGPT, tokens
from models.tap import tap_forward
from models.tap_inputs import context_of
from probes import degenerate, entropy, heads
from probes.common import ProbeInputError


class Routed(nn.Module):
    """One causal SDPA layer (optional), then a mixture of experts whose router softmax is
    [batch pos experts]: with experts == pos its last two sizes look like [q k]."""

    def __init__(self, attention: bool = True, experts: int = 8, d: int = 16, vocab: int = 50):
        super().__init__()
        self.attention, self.n_experts = attention, experts
        self.emb, self.qkv = nn.Embedding(vocab, d), nn.Linear(d, 3 * d)
        self.router, self.experts = nn.Linear(d, experts), nn.Linear(d, experts * d)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        b, n, d = x.shape
        if self.attention:
            q, k, v = (t.view(b, n, 2, d // 2).transpose(1, 2) for t in self.qkv(x).split(d, dim=-1))
            x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, d)
        gate = torch.softmax(self.router(x), dim=-1)  # [batch pos experts]
        mixed = (gate.unsqueeze(-1) * self.experts(x).view(b, n, self.n_experts, d)).sum(2)
        return self.out(x + mixed)


def test_a_router_softmax_is_not_attention():
    torch.manual_seed(0)
    ids = tokens(2, 8)  # as many positions as experts
    got = tap_forward(Routed(), ids)
    assert got.kinds == ["sdpa"] and [name for name, _ in got.layers] == [""]
    result = entropy.run(Routed(), ids)
    assert len(result.entropy) == 1 and len(result.entropy[0]) == 2
    with pytest.raises(ProbeInputError, match="no attention call the tap can read") as err:
        entropy.run(Routed(attention=False), ids)
    assert "\n" not in str(err.value)


def test_weights_on_the_meta_device_are_refused_in_one_line():
    with torch.device("meta"):
        model = PerHeadGPT()
    for probe in (entropy.run, degenerate.run, heads.run):
        with pytest.raises(ProbeInputError, match="meta device") as err:
            probe(model, tokens(1, 8))
        assert "\n" not in str(err.value)


class Masked(PerHeadGPT):
    """A forward that requires an attention mask, [batch pos] of 1 for real tokens (Hugging Face's)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        assert attention_mask.shape == input_ids.shape and bool((attention_mask == 1).all())
        return super().forward(input_ids)


class NeedsTargets(PerHeadGPT):
    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return super().forward(idx)


def test_a_required_attention_mask_is_given_and_other_arguments_named():
    torch.manual_seed(0)
    masked = Masked().eval()
    plain = PerHeadGPT().eval()
    plain.load_state_dict(masked.state_dict())
    ids = tokens(2, 10)
    assert entropy.run(masked, ids).entropy == entropy.run(plain, ids).entropy
    with pytest.raises(ProbeInputError, match=r"NeedsTargets.forward requires targets beside the ids") as err:
        entropy.run(NeedsTargets(), ids)
    assert "\n" not in str(err.value)


class Places(PerHeadGPT):
    """A 64-row position table under a name nothing reads as one, and no context attribute."""

    def __init__(self):
        super().__init__(ctx=64)
        self.context_length = None
        self.places = self.pos_emb
        del self.pos_emb

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.out_head(self.final_norm(self.trf_blocks(self.tok_emb(idx) + self.places(pos))))


def test_ids_longer_than_the_position_table_are_windowed_to_it():
    torch.manual_seed(0)
    model = PerHeadGPT(ctx=64).eval()
    model.context_length = None  # no attribute names the context: the 64-row pos_emb does
    assert context_of(model) == 64
    ids = tokens(1, 100)
    got = entropy.run(model, ids)
    assert (got.tokens, got.windows) == (100, 2)  # 64 + 36
    first = entropy.run(model, ids[:, :64])
    assert entropy.run(model, ids[:, 64:]).entropy != first.entropy  # the two windows differ
    with pytest.raises(ProbeInputError, match=r"Places's forward failed on 100 tokens \(IndexError") as err:
        entropy.run(Places().eval(), ids)
    assert "\n" not in str(err.value)
