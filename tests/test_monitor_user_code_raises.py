"""The user's own code raising as the Monitor reads it at construction (issue 60): a tokenizer whose
vocab_size, id_to_piece or tables raise, and a model whose forward raises on the Monitor's
model(ids) though its signature defaults its other arguments. Each is one ValueError line naming
the class, what raised and the way out, never the user's traceback out of Monitor()."""

from __future__ import annotations

import pytest
import torch
from gpt_kit import VOCAB, PerHeadGPT, tokens

from train.monitor import Monitor
from train.monitor.tokenizer import saveable_tokenizer


class Raising:
    """A character tokenizer whose `broken` attribute raises RuntimeError when read or called."""

    def __init__(self, broken: str):
        self.broken, self.pieces = broken, [chr(97 + i) for i in range(VOCAB)]

    def encode(self, text):
        return [self.pieces.index(c) for c in text]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)

    @property
    def vocab_size(self):
        if self.broken == "vocab_size":
            raise RuntimeError("vocab not loaded yet")
        return (lambda: len(self.pieces)) if self.broken == "vocab_size()" else len(self.pieces)

    def id_to_piece(self, i):
        if self.broken == "id_to_piece(i)" and i == 3:
            raise RuntimeError("piece 3 is reserved")
        return self.pieces[i]

    @property
    def itos(self):
        if self.broken == "itos":
            raise RuntimeError("itos is private")
        return None


class RaisingSize(Raising):
    """vocab_size a method that raises."""

    def vocab_size(self):  # type: ignore[override]
        raise RuntimeError("vocab not loaded yet")


@pytest.mark.parametrize("tokenizer, what, says", [
    (Raising("vocab_size"), "vocab_size", "RuntimeError: vocab not loaded yet"),
    (RaisingSize(""), "vocab_size()", "RuntimeError: vocab not loaded yet"),
    (Raising("id_to_piece(i)"), "id_to_piece(i)", "RuntimeError: piece 3 is reserved"),
    (Raising("itos"), "itos", "RuntimeError: itos is private"),
])
def test_a_tokenizer_whose_own_code_raises_is_one_line_naming_it(tokenizer, what, says):
    with pytest.raises(ValueError) as refused:
        saveable_tokenizer(tokenizer, VOCAB)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"Monitor: tokenizer= is a {type(tokenizer).__name__} whose {what} raised")
    assert says in line
    assert saveable_tokenizer(Raising(""), VOCAB).vocab_size == VOCAB  # the same tokenizer, nothing raising


class MaskedGPT(PerHeadGPT):
    """A forward whose attention_mask defaults to None but which needs one (a padding mask it multiplies in)."""

    def forward(self, idx, attention_mask=None):  # type: ignore[override]
        keep = attention_mask.bool()  # AttributeError on None: the user's code
        return super().forward(idx) * keep[..., None]


def test_a_forward_that_raises_on_the_monitors_call_is_one_line(tmp_path):
    model = MaskedGPT()
    ids = tokens(2, 8)
    assert model(ids, attention_mask=torch.ones_like(ids)).shape == (2, 8, VOCAB)  # it runs, given its mask
    with pytest.raises(ValueError) as refused:
        Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), tmp_path / "run", eval_tokens=ids, report=False)
    line = str(refused.value)
    assert "\n" not in line and "MaskedGPT failed on eval_tokens of shape [2, 8]" in line
    assert "its forward raised AttributeError: 'NoneType' object has no attribute 'bool'" in line
    assert "attention_mask = torch.ones_like(ids)" in line and "forward(ids) calls yours" in line
    assert not (tmp_path / "run").exists()
    plain = PerHeadGPT()
    with pytest.raises(ValueError, match="Monitor: tokenizer= is a Raising whose vocab_size raised"):
        Monitor(plain, torch.optim.SGD(plain.parameters(), lr=0.1), tmp_path / "run", eval_tokens=ids,
                tokenizer=Raising("vocab_size"), report=False)
