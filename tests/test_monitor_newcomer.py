"""What the Monitor does with a newcomer's own loop: their tokenizer saved as data (or refused in one
line at construction), the last logged step saved when it closes, snapshots on save steps that are
not log steps, and no step time for a log call that took no step."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gpt_kit import EinsumGPT

from models.checkpoint import list_snapshots, load_checkpoint
from models.tokenizers import CharTokenizer
from train.guard import Guard
from train.monitor import Monitor

TEXT = "the king and the queen shall not be what thou art.\n"
EVAL = torch.arange(2 * 16).remainder(20).view(2, 16)  # [2 16] ids below the model's 20


class MyCharTokenizer:
    """A newcomer's character tokenizer: ids in order of first appearance, dicts both ways."""

    def __init__(self, text: str, table: str = "both"):
        order = list(dict.fromkeys(text))
        self.stoi = {c: i for i, c in enumerate(order)}
        self.itos = {i: c for c, i in self.stoi.items()}
        if table == "list":  # only a list of pieces
            self.vocab, self.stoi, self.itos = order, None, None
        if table == "pieces":  # only id_to_piece and vocab_size, the stoi kept private
            self._stoi, self.stoi, self.itos, self.vocab_size = self.stoi, None, None, len(order)
            self.id_to_piece = order.__getitem__

    def encode(self, text: str) -> list[int]:
        table = self.stoi or getattr(self, "_stoi", None) or {c: i for i, c in enumerate(self.vocab)}
        return [table[c] for c in text]

    def decode(self, ids) -> str:
        pieces = self.itos or dict(enumerate(getattr(self, "vocab", None) or [self.id_to_piece(i) for i in range(self.vocab_size)]))
        return "".join(pieces[i] for i in ids)


def tiny_tiktoken():
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {bytes([b]): b for b in range(256)}
    for token in (b"th", b"the", b" the", b"ng", b" k", b"ing", b" king"):  # each one merge of lower ones
        ranks[token] = len(ranks)
    return tiktoken.Encoding("tiny", pat_str=r" ?\w+| ?[^\s\w]+|\s+", mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)})


def word_tokenizers() -> tuple:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = {w: i for i, w in enumerate(["the", "king", "and", "queen", "[UNK]"])}
    backend = Tokenizer(models.WordLevel(table, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return backend, PreTrainedTokenizerFast(tokenizer_object=backend)


def model(vocab: int = 20) -> EinsumGPT:
    torch.manual_seed(0)
    return EinsumGPT(vocab=vocab, d=16, n_heads=2, n_layers=1, context=16)


def monitor(tmp_path: Path, tokenizer, vocab: int = 20, **settings) -> Monitor:
    net = model(vocab)
    return Monitor(net, torch.optim.SGD(net.parameters(), lr=0.1), tmp_path / "run", report=False,
                   eval_tokens=EVAL, tokenizer=tokenizer, model_args={"vocab": vocab}, **settings)


def steps(m: Monitor, numbers, vocab: int = 20) -> None:
    net = m.model
    for step in numbers:
        x = torch.randint(0, vocab, (2, 17), generator=torch.Generator().manual_seed(step))  # [batch pos+1]
        loss = F.cross_entropy(net(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        m.optimizer.zero_grad()
        loss.backward()
        m.optimizer.step()
        m.log(step, train_loss=loss.item())


def test_a_users_tokenizer_is_saved_as_data_and_reads_back_with_its_own_ids(tmp_path):
    from train.monitor.tokenizer import saveable_tokenizer

    for table in ("list", "pieces"):  # the vocabulary read from a list, or from id_to_piece and vocab_size
        ours = saveable_tokenizer(MyCharTokenizer(TEXT, table), 20)
        assert ours.encode(TEXT) == MyCharTokenizer(TEXT).encode(TEXT) and ours.decode(ours.encode(TEXT)) == TEXT
    words = word_tokenizers()  # a tokenizers.Tokenizer and the Hugging Face fast tokenizer around it
    for user in words:
        ours = saveable_tokenizer(user, 20)
        assert ours.kind == "gpt2" and ours.encode("the king and the queen") == [0, 1, 2, 0, 3]
    cases = {"both dicts": MyCharTokenizer(TEXT), "tiktoken": tiny_tiktoken()}
    for name, user in cases.items():
        vocab = 300 if name == "tiktoken" else 20
        out = tmp_path / name.replace(" ", "_")
        with monitor(out, user, vocab, save_every=5) as m:
            steps(m, range(1), vocab)
        snap = load_checkpoint(out / "run")
        assert snap.tokenizer is not None, name
        want = user.encode(TEXT) if name != "tiktoken" else user.encode(TEXT, allowed_special="all")
        assert snap.tokenizer.encode(TEXT) == want and snap.tokenizer.decode(want) == TEXT, name
        if name == "tiktoken":
            assert snap.tokenizer.encode(" the king") == [258, 262]  # ' the' and ' king', merged as tiktoken does
        else:
            assert [snap.tokenizer.id_to_piece(i) for i in range(snap.tokenizer.vocab_size)] == list(dict.fromkeys(TEXT))


def test_what_cannot_be_saved_as_data_is_refused_in_one_line_at_construction(tmp_path, caplog):
    class OnlySave:
        def save(self, folder):
            return []

    class SaveRaises(CharTokenizer):
        def save(self, folder):
            raise OSError(28, "No space left on device")

    class Shifted(MyCharTokenizer):  # encodes each character one id up: not its own table
        def encode(self, text):
            return [i + 1 for i in super().encode(text)]

    class Words(MyCharTokenizer):
        def __init__(self):
            super().__init__(TEXT)
            self.itos = {0: "the", 1: " king"}

    cases = [("abc", "is a str ('abc')"), (OnlySave(), "has no encode and decode"),
             (CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyz"), "26 ids, more than the model's 20 logits"),
             (SaveRaises.from_text(TEXT), "could not be saved and read back"), (Shifted(TEXT), "do not map each"),
             (Words(), "piece 0 is 'the', not one character")]
    for i, (tokenizer, said) in enumerate(cases):
        with pytest.raises(ValueError) as raised:
            monitor(tmp_path / str(i), tokenizer, save_every=5)
        message = str(raised.value)
        assert message.startswith("Monitor: tokenizer= ") and said in message and "\n" not in message, message
        assert not (tmp_path / str(i)).exists()  # refused before the run folder was made
    with caplog.at_level(logging.WARNING):
        monitor(tmp_path / "no_saves", CharTokenizer.from_text(TEXT)).close()
    assert "save_every=0 saves none" in caplog.text


def test_the_last_logged_step_is_saved_at_close_and_save_steps_need_not_be_log_steps(tmp_path):
    with monitor(tmp_path / "a", None, save_every=5, log_every=2) as m:
        steps(m, range(12))  # steps 0-11: saved on the way at 0, 5, 10; 11 when it closes
    assert [p.name for p in list_snapshots(tmp_path / "a" / "run")] == [f"step_{s:06d}" for s in (0, 5, 10, 11)]
    last = load_checkpoint(tmp_path / "a" / "run")
    net = m.model
    assert all(torch.equal(last.model.state_dict()[k], v) for k, v in net.state_dict().items())  # the final weights
    with monitor(tmp_path / "b", None, save_every=3, log_every=10) as m:
        steps(m, range(21))  # was step 0 only: 3, 6, ... are not log steps; 20 at close
    assert [int(p.name[5:]) for p in list_snapshots(tmp_path / "b" / "run")] == [0, 3, 6, 9, 12, 15, 18, 20]
    assert [r["step"] for r in m.records] == [0, 10, 20]  # the records keep their own cadence


def test_a_log_call_that_took_no_step_records_no_step_time(tmp_path):
    with monitor(tmp_path, None, log_every=2) as m:
        steps(m, range(5))
        m.log(5, val_loss=1.0)  # after the loop: an evaluation, no optimizer step since step 4
    records = {r["step"]: r for r in m.records}
    assert "step_time_ms" in records[2] and "step_time_ms" in records[4]
    assert "step_time_ms" not in records[5] and records[5]["val_loss"] == 1.0
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 5


def test_the_guards_stop_leaves_no_snapshot_of_the_stopped_step(tmp_path):
    """The guard's stop saves the state it restored (step 50, taken at its calm check); the Monitor
    it closes then saves nothing under step 78, whose weights the model no longer holds."""
    m = monitor(tmp_path, None, save_every=1000, guard=Guard(every=50, max_rescues=2))  # a state kept every 50 steps
    net, bad = m.model, {62, 70, 78}  # three NaN losses: two rescues, then the stop
    with pytest.raises(SystemExit), m:
        for step in range(100):
            x = torch.randint(0, 20, (2, 17), generator=torch.Generator().manual_seed(step))  # [batch pos+1]
            loss = F.cross_entropy(net(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            m.optimizer.zero_grad()
            loss.backward()
            m.optimizer.step()
            m.log(step, train_loss=float("nan") if step in bad else loss.item())
    assert [p.name for p in list_snapshots(tmp_path / "run")] == ["step_000000", "step_000050"]
    saved = load_checkpoint(tmp_path / "run" / "step_000050").model.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in net.state_dict().items())  # what the model holds now
