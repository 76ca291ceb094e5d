"""Blocks that return a delta (issue 58, item 1): many tutorial GPTs add the residual in the parent
(`x = x + block(x)`), so a block's output is not the residual stream. `tests/gpt_kit/einsum.DeltaGPT`
is EinsumGPT's very function written that way: with the same weights the two have the same logits
and the same stream at every layer, so every reading of the stream must agree between them: the
lens (its last layer the model's own logits: KL 0), the Monitor's residual rms, and no "readout is
not final norm + unembedding" warning. An attention-only model is said to have no MLP."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from gpt_kit.einsum import CONTEXT, DeltaGPT, EinsumGPT
from torch import nn

from models.checkpoint import read_metrics
from probes import logit_lens
from train.monitor import Monitor

VOCAB = 40


def twins() -> tuple[EinsumGPT, DeltaGPT]:
    torch.manual_seed(0)
    plain = EinsumGPT(vocab=VOCAB)
    delta = DeltaGPT(vocab=VOCAB)
    delta.load_state_dict(plain.state_dict())
    return plain.eval(), delta.eval()


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, CONTEXT), generator=torch.Generator().manual_seed(seed))  # [batch pos]


def test_the_twins_are_one_function():
    plain, delta = twins()
    x = tokens()
    assert torch.allclose(plain(x), delta(x), atol=1e-5)  # the test's premise, float order aside


def test_the_lens_reads_the_stream_of_a_delta_gpt_as_of_its_twin(caplog):
    """KL(final || layer) per layer, equal on the twins (1e-4 nats: float order of the sums); the last
    layer's ~0 on both (it was 0.18 on the delta GPT, read from its last block's delta)."""
    plain, delta = twins()
    with caplog.at_level(logging.WARNING, logger="probes.logit_lens"):
        a, b = (logit_lens.run(m, tokens()) for m in (plain, delta))
    assert a.kl_to_final[-1] < 1e-6 and b.kl_to_final[-1] < 1e-6
    assert a.kl_to_final == pytest.approx(b.kl_to_final, abs=1e-4)
    assert not [r for r in caplog.records if "readout is not" in r.getMessage()]


def monitored(model: nn.Module, out) -> list[dict]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with Monitor(model, optimizer, out, log_every=1, eval_every=1, eval_tokens=tokens(2), report=False) as monitor:
        for step in range(2):
            x = tokens(10 + step)
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.log(step, train_loss=loss.item())
    return read_metrics(out)


def test_the_monitor_reads_the_residual_rms_of_a_delta_gpt_as_of_its_twin(tmp_path):
    plain, delta = twins()
    a, b = monitored(plain.train(), tmp_path / "plain"), monitored(delta.train(), tmp_path / "delta")
    for ra, rb in zip(a, b):
        assert ra["resid_rms"].keys() == rb["resid_rms"].keys() == {"0", "1"}
        assert list(rb["resid_rms"].values()) == pytest.approx(list(ra["resid_rms"].values()), rel=1e-4)


class AttentionOnly(EinsumGPT):
    """No MLP at all: each block is its attention (and a norm)."""

    def __init__(self, vocab: int = VOCAB):
        super().__init__(vocab=vocab)
        for layer in self.layers:
            del layer.ff, layer.norm2

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        where = torch.arange(idx.shape[1], device=idx.device)
        x = self.emb["tok"](idx) + self.emb["where"](where)
        for layer in self.layers:
            x = x + layer.attn(layer.norm1(x))
        return self.out(self.final(x))


def test_an_attention_only_model_is_said_to_have_no_mlp(tmp_path):
    import json

    torch.manual_seed(0)
    monitored(AttentionOnly(vocab=VOCAB).train(), tmp_path / "run")
    said = json.loads((tmp_path / "run" / "run.json").read_text())["model"]["activations"]
    assert said.startswith("not measured: no MLP"), said
