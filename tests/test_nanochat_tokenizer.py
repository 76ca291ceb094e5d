"""nanochat's ``tokenizer/tokenizer.pkl`` read without unpickling (models.store.nanochat_tokenizer):
a hostile pickle never runs (a marker file it would write is never written) and is refused in one
line, as is a damaged one; a genuine one, a tiktoken Encoding pickled as nanochat's
RustBPETokenizer.save pickles it, encodes as tiktoken itself and nanochat's own tokenizer do."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from models.store.nanochat_tokenizer import NanochatTokenizer, TokenizerFileError, load_encoding, read_encoding_state
from models.tokenizer_base import TokenizerError

# nanochat's split pattern and special tokens (nanochat/tokenizer.py), restated here
PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
           r"""\s*[\r\n]|\s+(?!\S)|\s+""")
SPECIAL = ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
           "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>"]
MERGES = [b"th", b"he", b"the", b" the", b"in", b"an"]  # ranks after the 256 bytes
TOKENIZER_VOCAB = 256 + len(MERGES) + len(SPECIAL)
TEXT = "Then the man ran in the hall, and the 42 cats sang!\n"


def genuine_encoding():
    """A tiktoken Encoding made as nanochat's train_from_iterator makes its own."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {bytes([b]): b for b in range(256)} | {m: 256 + i for i, m in enumerate(MERGES)}
    return tiktoken.Encoding(name="rustbpe", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={s: len(ranks) + i for i, s in enumerate(SPECIAL)})


def write_tokenizer(base: Path) -> Path:
    """``base/tokenizer/tokenizer.pkl`` as RustBPETokenizer.save writes it: the Encoding pickled."""
    folder = base / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "tokenizer.pkl", "wb") as f:
        pickle.dump(genuine_encoding(), f)
    return folder / "tokenizer.pkl"


class Marker:
    """Unpickled, it would write the marker file: `os.system` / `exec` on a path."""

    def __init__(self, path: Path, how: str = "exec"):
        self.path, self.how = path, how

    def __reduce__(self):
        if self.how == "system":
            return (os.system, (f"touch {self.path}",))
        return (exec, (f"open({str(self.path)!r}, 'w').write('ran')",))


def hostile_pickles(marker: Path) -> dict[str, bytes]:
    """Pickles that would write `marker` if unpickled, some dressed as tiktoken's Encoding."""
    encoding_then_reduce = (b"\x80\x04\x8c\rtiktoken.core\x94\x8c\x08Encoding\x94\x93\x94"  # the class
                            + b"\x8c\x05gpt2_\x85R.")  # REDUCE on it with ("gpt2_",)
    state_calls = pickle.dumps(Marker(marker))  # a BUILD state that is itself a call
    nested = (b"\x80\x04\x8c\rtiktoken.core\x8c\x08Encoding\x93)\x81" + state_calls[2:-1] + b"b.")
    return {"exec": pickle.dumps(Marker(marker)), "os.system": pickle.dumps(Marker(marker, "system")),
            "protocol 0": pickle.dumps(Marker(marker), protocol=0),
            "Encoding then REDUCE": encoding_then_reduce, "state that calls": nested}


def test_a_hostile_pickle_never_runs_and_is_refused_in_one_line(tmp_path):
    marker = tmp_path / "ran"
    for name, data in hostile_pickles(marker).items():
        (tmp_path / "tokenizer.pkl").write_bytes(data)
        with pytest.raises(TokenizerFileError) as caught:
            read_encoding_state(tmp_path / "tokenizer.pkl")
        message = str(caught.value)
        assert not marker.exists(), name
        assert "\n" not in message and message.startswith(f"{tmp_path / 'tokenizer.pkl'}: "), (name, message)
        assert "refused" in message or "damaged" in message, (name, message)
    pickle.loads(hostile_pickles(marker)["exec"])  # through pickle itself the same bytes do run:
    assert marker.read_text() == "ran"  # the traps are real


def test_a_damaged_or_foreign_file_is_one_line_naming_it(tmp_path):
    genuine = pickle.dumps({"name": "x"})  # a plain dict: a pickle, but no Encoding
    cases = {"truncated": pickle.dumps(["a" * 40, b"bytes"])[:-9], "random bytes": os.urandom(64),
             "empty": b"", "text": b"not a pickle at all\n", "a plain dict": genuine}
    for name, data in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.pkl"
        path.write_bytes(data)
        with pytest.raises(TokenizerFileError) as caught:
            read_encoding_state(path)
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{path}: "), (name, message)


def test_the_state_must_be_plain_ranks_pattern_and_specials(tmp_path):
    data = pickle.dumps(genuine_encoding())
    cases = {"mergeable_rankz": (data.replace(b"mergeable_ranks", b"mergeable_rankz"), "whose state has keys"),
             "an int name": (data.replace(b"\x8c\x07rustbpe", b"K\x07", 1), "is not str name"),
             "by reference": (b"\x80\x04\x8c\rtiktoken.core\x8c\x08Encoding\x93)\x81\x8c\x04gpt2b.", "by reference")}
    for name, (raw, said) in cases.items():
        (tmp_path / "t.pkl").write_bytes(raw)
        with pytest.raises(TokenizerFileError, match=rf"t\.pkl: .*{said}"):
            read_encoding_state(tmp_path / "t.pkl")
        assert name != "an int name" or b"rustbpe" not in raw


def test_a_genuine_tokenizer_encodes_as_tiktoken_and_nanochat_do(tmp_path):
    path = write_tokenizer(tmp_path)
    enc = genuine_encoding()
    ours = NanochatTokenizer(load_encoding(path), path.parent)
    assert ours.encode(TEXT) == enc.encode_ordinary(TEXT) and ours.decode(ours.encode(TEXT)) == TEXT
    assert ours.vocab_size == TOKENIZER_VOCAB and ours.piece_to_id(" the") == 259
    assert ours.id_to_piece(259) == " the" and len(ours.encode(TEXT)) < len(TEXT.encode())
    try:
        from nanochat.tokenizer import RustBPETokenizer
    except ImportError:
        return  # nanochat's own tokenizer (rustbpe) absent: tiktoken's is the reference
    theirs = RustBPETokenizer.from_directory(str(path.parent))  # the file this test wrote: trusted here
    assert ours.encode(TEXT) == theirs.encode(TEXT) and ours.id_to_piece(259) == theirs.id_to_token(259)
    assert ours.vocab_size == theirs.get_vocab_size()


def test_a_tokenizer_nanochat_itself_trained_and_saved_loads(tmp_path):
    tokenizer = pytest.importorskip("nanochat.tokenizer")
    trained = tokenizer.RustBPETokenizer.train_from_iterator(iter([TEXT * 20]), vocab_size=300)
    trained.save(str(tmp_path / "tokenizer"))
    ours = NanochatTokenizer(load_encoding(tmp_path / "tokenizer" / "tokenizer.pkl"), tmp_path)
    assert ours.encode(TEXT) == trained.encode(TEXT) and ours.vocab_size == trained.get_vocab_size() > 256
    assert ours.decode(trained.encode(TEXT)) == TEXT


def encoding_pickle(state_ops: bytes) -> bytes:
    """An Encoding made with no arguments whose BUILD state is what `state_ops` push."""
    return b"\x80\x04\x8c\rtiktoken.core\x8c\x08Encoding\x93)\x81" + state_ops + b"b."


def doubling(times: int, width: int = 2) -> bytes:
    """'a', then a tuple holding the previous value `width` (2 or 3) times, `times` times, through
    the memo: width**times values in a few bytes."""
    ops = b"\x8c\x01a\x94"  # memo 0
    for i in range(times):  # the previous value on the stack, BINGET it again, TUPLE2/3, memo i+1
        ops += (b"h" + bytes([i])) * (width - 1) + (b"\x86" if width == 2 else b"\x87") + b"\x94"
    return ops


def test_a_pickle_that_would_never_finish_or_overflow_the_stack_is_refused_at_once(tmp_path):
    """700 bytes that double 60 times (formatting the state never ended) and 300,000 nested tuples."""
    cases = {"doubles 60 times": (encoding_pickle(doubling(60)), "(more than 4194304 values|deeper than 16)"),
             "triples 14 times": (encoding_pickle(doubling(14, width=3)), "more than 4194304 values"),
             "300,000 deep": (encoding_pickle(b")" + b"\x85" * 300_000), "nests deeper than 16"),
             "deep dicts": (encoding_pickle(b"}" + b"\x8c\x01k}" * 50 + b"s" * 50), "nests deeper than 16")}
    for name, (raw, said) in cases.items():
        (tmp_path / "t.pkl").write_bytes(raw)
        with pytest.raises(TokenizerFileError, match=rf"^{tmp_path / 't.pkl'}: refused: .*{said}") as caught:
            read_encoding_state(tmp_path / "t.pkl")
        assert "\n" not in str(caught.value), name
    assert len(encoding_pickle(doubling(60))) < 800
    (tmp_path / "t.pkl").write_bytes(encoding_pickle(doubling(3)))  # small sharing is still read,
    with pytest.raises(TokenizerFileError, match="whose state is a tuple"):  # and refused for what it is
        read_encoding_state(tmp_path / "t.pkl")


def test_ranks_or_a_pattern_that_make_tiktoken_panic_are_one_line(tmp_path):
    """tiktoken panics (a Rust PanicException, a BaseException) on a byte without a rank and on a
    pattern past its backtracking limit: the first is refused at load, the second when text meets it."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {bytes([b]): b for b in range(256)}
    no_a = {k: v for k, v in ranks.items() if k != b"A"}
    (tmp_path / "t.pkl").write_bytes(pickle.dumps(tiktoken.Encoding("x", pat_str=r"\S+|\s+", mergeable_ranks=no_a,
                                                                    special_tokens={})))
    with pytest.raises(TokenizerFileError, match=r"t\.pkl: mergeable_ranks has no rank for the byte 0x41"):
        read_encoding_state(tmp_path / "t.pkl")
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    (folder / "tokenizer.pkl").write_bytes(pickle.dumps(tiktoken.Encoding(
        "x", pat_str=r"(a|a)+(?!x)c", mergeable_ranks=ranks, special_tokens={})))
    ours = NanochatTokenizer(load_encoding(folder / "tokenizer.pkl"), folder)
    with pytest.raises(TokenizerError, match=r"tokenizer\.pkl: tiktoken failed to encode the text \(.*Backtrack"):
        ours.encode("a" * 30)
