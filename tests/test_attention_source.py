"""One way for a model into the attention probes (`probes.sources.source_of`): the model is checked
once per run (one forward pass of the tap's check, one walk over its parameters for the device),
and a source given to a runner is used as it is, so a fourth kind (saved readings) is one class."""

from __future__ import annotations

import functools

import pytest
import torch

from gpt_kit import PerHeadGPT, tokens
from models import build_model, get_preset
from probes import degenerate, entropy, heads
from probes.sources import source_of
from probes.sources.attention import AttentionSource, ModelDims


def counted(model: torch.nn.Module) -> dict[str, int]:
    """Counts of the model's forward calls and of the walks over its parameters (device, checks)."""
    seen = {"forward": 0, "parameters": 0}

    def counting(name: str):
        real = getattr(model, name)

        @functools.wraps(real)
        def method(*args, **kwargs):
            seen[name] += 1
            return real(*args, **kwargs)
        return method
    model.forward, model.parameters = counting("forward"), counting("parameters")  # run_with_hooks calls .forward
    return seen


@pytest.mark.parametrize("probe", [entropy.run, degenerate.run, heads.run])
def test_a_run_checks_the_model_once(probe):
    torch.manual_seed(0)
    tapped, ours = PerHeadGPT().eval(), build_model(get_preset("transformer2_small")).eval()
    for model, check_passes in ((tapped, 1), (ours, 0)):  # the tap's check is one short forward
        seen = counted(model)
        probe(model, tokens(6, 12, vocab=50), batch_size=2)  # 3 batches
        assert seen == {"forward": check_passes + 3, "parameters": 1}


class Fixed(AttentionSource):
    """A source with no model: one layer of one head attending uniformly over its window of 3."""

    kind, name = "fixed", "Fixed"

    def __init__(self):
        self.dims, self.device, self.windows = ModelDims(1, 1, 16, 10), torch.device("cpu"), {0: 3}

    def each_layer_pattern(self, batch, layers, reduce):
        n = batch.shape[1]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        seen = ((j <= i) & (j > i - 3)).double()  # [q k]
        reduce(0, (seen / seen.sum(-1, keepdim=True)).expand(batch.shape[0], 1, n, n))
        return 1


def test_a_source_given_to_a_runner_is_read_as_it_is():
    got = entropy.run(Fixed(), tokens(2, 8, vocab=10))
    assert got.model == "Fixed(n_layers=1, n_heads=1, n_ctx=16)"
    # H_i = ln(min(i + 1, 3)) on paper: rows 0..7 -> 0, ln 2, ln 3 x 6
    assert got.entropy[0][0] == pytest.approx((torch.tensor(2.0).log() + 6 * torch.tensor(3.0).log()).item() / 8,
                                              rel=1e-6)
    assert got.entropy_normalized[0][0] == pytest.approx(1.0, rel=1e-6)
    assert degenerate.run(Fixed(), tokens(2, 8, vocab=10)).verdicts == [["uniform"]]
    assert source_of(Fixed()).windows == {0: 3}
