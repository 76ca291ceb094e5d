"""The probes that read our hook points or config (activations, updates' windows) on a model we
never rebuilt (a tutorial GPT, nanochat's GPT): one line saying so and what does read it, where they
raised AttributeError "'PerHeadGPT' object has no attribute 'cfg'" with a traceback."""

from __future__ import annotations

import pytest

from gpt_kit import BatchedGPT, tokens
from probes import activations
from probes.common import lm_windows
from probes.errors import ProbeInputError


@pytest.mark.parametrize("call", [lambda m: activations.run(m, tokens()), lambda m: lm_windows(m, tokens())],
                         ids=["activations", "lm_windows"])
def test_a_model_without_our_config_is_one_line(call):
    with pytest.raises(ProbeInputError) as err:
        call(BatchedGPT().eval())
    message = str(err.value)
    assert "\n" not in message and "BatchedGPT is not one of our models" in message
    assert "entropy, degenerate, heads" in message
