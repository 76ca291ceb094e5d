"""Tests for models/tokenizers.py: char vocab.json format, errors, SentencePiece BPE round trip."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.tokenizers import (
    TOKENIZER_KINDS,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    TokenizerError,
    UnknownTokenError,
    load_tokenizer,
    tokenizer_kind_files,
)

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\tSpeak, speak!  (twice)\n"

SHAKESPEARE = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer",
    "The slings and arrows of outrageous fortune,",
    "Or to take arms against a sea of troubles",
    "And by opposing end them.  To die: to sleep;",
    "",
    "  No more; and by a sleep to say we end",
    "The heart-ache and the thousand natural shocks",
    "That flesh is heir to, 'tis a consummation",
    "Devoutly to be wish'd. To die, to sleep;",
    "To sleep: perchance to dream: ay, there's the rub;",
    "For in that sleep of death what dreams may come",
    "When we have shuffled off this mortal coil,",
    "Must give us pause: there's the respect",
    "That makes calamity of so long life;",
    "ROMEO.  But, soft! what light through yonder window breaks?",
    "It is the east, and Juliet is the sun.",
]

BPE_VOCAB = 400


# ----------------------------------------------------------------------------- char


def test_char_round_trip_and_sorted_ids() -> None:
    tok = CharTokenizer.from_text(TEXT)
    assert tok.kind == "char" and isinstance(tok, Tokenizer)
    assert list(tok.chars) == sorted(set(TEXT))
    assert tok.vocab_size == len(set(TEXT))
    ids = tok.encode(TEXT)
    assert len(ids) == len(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.id_to_piece(0) == "\t" and tok.piece_to_id("\n") == 1
    assert [tok.id_to_piece(i) for i in ids[:5]] == list("First")


@given(st.data())
@settings(max_examples=100, deadline=None)
def test_char_round_trip_property(data: st.DataObject) -> None:
    alphabet = data.draw(st.text(min_size=1, max_size=40), label="alphabet")
    tok = CharTokenizer.from_text(alphabet)
    text = data.draw(st.text(alphabet=sorted(set(alphabet)), max_size=200), label="text")
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_decode_accepts_tuples_and_tensors() -> None:
    torch = pytest.importorskip("torch")
    tok = CharTokenizer.from_text("abc")
    assert tok.decode((2, 0)) == "ca"
    assert tok.decode(torch.tensor([1, 2, 0])) == "bca"
    with pytest.raises(TokenizerError, match="integers"):
        tok.decode([1.0])  # type: ignore[list-item]


def test_vocab_json_written_in_series_format(tmp_path: Path) -> None:
    tok = CharTokenizer.from_text("ba\n é")
    (path,) = tok.save(tmp_path)
    assert path == tmp_path / "vocab.json"
    expected = {"0": "\n", "1": " ", "2": "a", "3": "b", "4": "é"}
    assert json.loads(path.read_text(encoding="utf-8")) == expected
    # byte for byte what the series' json.dump({i: c}) writes
    series = {i: c for i, c in enumerate(["\n", " ", "a", "b", "é"])}
    assert path.read_text(encoding="utf-8") == json.dumps(series)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.json"]  # no temp file left


def test_series_vocab_json_in_set_order_keeps_ids(tmp_path: Path) -> None:
    path = tmp_path / "vocab.json"
    path.write_text('{"0": "z", "1": "a", "2": "\\n", "3": " "}', encoding="utf-8")
    tok = CharTokenizer.from_vocab_json(path)
    assert tok.chars == ("z", "a", "\n", " ")
    assert tok.encode("za\n a") == [0, 1, 2, 3, 1]
    assert tok.decode([2, 0]) == "\nz"
    out = tmp_path / "out"
    out.mkdir()
    tok.save(out)
    assert json.loads((out / "vocab.json").read_text()) == {"0": "z", "1": "a", "2": "\n", "3": " "}


def test_vocab_json_keys_out_of_order_in_file(tmp_path: Path) -> None:
    path = tmp_path / "vocab.json"
    path.write_text('{"2": "c", "0": "a", "1": "b"}', encoding="utf-8")
    assert CharTokenizer.from_vocab_json(path).encode("abc") == [0, 1, 2]


def test_unknown_character_error_names_char_and_position() -> None:
    tok = CharTokenizer.from_text("abc ")
    with pytest.raises(UnknownTokenError) as info:
        tok.encode("ab é")
    msg = str(info.value)
    assert "'é'" in msg and "position 3" in msg and "(4 characters)" in msg
    assert "\n" not in msg
    assert isinstance(info.value, TokenizerError) and isinstance(info.value, ValueError)


def test_unknown_characters_error_lists_several() -> None:
    tok = CharTokenizer.from_text("ab")
    with pytest.raises(UnknownTokenError) as info:
        tok.encode("aXbY" + "Z" * 10)
    msg = str(info.value)
    assert "'X' at position 1" in msg and "'Y' at position 3" in msg
    assert "and 7 more" in msg


def test_char_id_errors() -> None:
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(TokenizerError, match=r"token id 3 .*vocab_size 3"):
        tok.decode([0, 3])
    with pytest.raises(TokenizerError, match=r"token id -1"):
        tok.decode([-1])  # would silently index from the end of a list
    with pytest.raises(TokenizerError, match="token id 7"):
        tok.id_to_piece(7)
    with pytest.raises(UnknownTokenError, match="'q'"):
        tok.piece_to_id("q")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("not json {", "not valid JSON"),
        ('["a", "b"]', "expected a JSON object"),
        ('{"0": "a", "2": "b"}', "contiguous"),
        ('{"1": "a", "2": "b"}', "contiguous"),
        ('{"0": "a", "1": "a"}', "appears twice"),
        ('{"0": "a", "1": "bc"}', "single character"),
        ('{"0": "a", "1": 5}', "single character"),
        ('{"0": "a", "x": "b"}', "not a non-negative integer"),
        ('{"0": "a", "-1": "b"}', "not a non-negative integer"),
        ('{"0": "a", "0": "b"}', "more than once"),
        ("{}", "empty"),
    ],
)
def test_corrupt_vocab_json_names_file(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TokenizerError) as info:
        CharTokenizer.load(tmp_path)
    assert str(path) in str(info.value)
    assert problem in str(info.value)


def test_char_constructor_validates() -> None:
    with pytest.raises(TokenizerError, match="appears twice"):
        CharTokenizer(["a", "b", "a"])
    with pytest.raises(TokenizerError, match="empty"):
        CharTokenizer.from_text("")


def test_save_into_missing_directory_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        CharTokenizer.from_text("ab").save(tmp_path / "nope")


# ----------------------------------------------------------------------------- BPE


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = []
    for rep in range(40):
        for k, line in enumerate(SHAKESPEARE):
            lines.append(line if (rep + k) % 3 else line.upper())
    path = tmp_path_factory.mktemp("corpus") / "shakespeare.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert path.stat().st_size > 20_000
    return path


@pytest.fixture(scope="module")
def bpe(corpus_file: Path) -> BPETokenizer:
    return BPETokenizer.train(corpus_file, BPE_VOCAB)


def test_bpe_basic_properties(bpe: BPETokenizer, corpus_file: Path) -> None:
    assert bpe.kind == "bpe" and isinstance(bpe, Tokenizer)
    assert bpe.vocab_size == BPE_VOCAB
    assert len(bpe.encode("the")) < len("the")
    assert [bpe.id_to_piece(i) for i in bpe.encode(" the")] == ["\u2581the"]
    text = corpus_file.read_text(encoding="utf-8")
    assert len(bpe.encode(text)) < 0.75 * len(text)  # ~140 merges already compress it
    assert bpe.id_to_piece(bpe.piece_to_id("\n")) == "\n"
    assert bpe.encode("a\nb").count(bpe.piece_to_id("\n")) == 1


def test_bpe_round_trip_exact(bpe: BPETokenizer, corpus_file: Path) -> None:
    text = corpus_file.read_text(encoding="utf-8")[:3000]
    assert bpe.decode(bpe.encode(text)) == text
    tricky = [
        "  leading spaces, double  spaces and trailing   ",
        "\n\nblank lines\n\n\n",
        "tabs\tand\r\nCRLF",
        "unseen: é ü 漢字 😀 — ﬁ",
        "literal \u2581 lower-block and <unk> <s> <0x0A>",
        "",
    ]
    for s in tricky:
        ids = bpe.encode(s)
        assert all(0 <= i < bpe.vocab_size for i in ids)
        assert bpe.decode(ids) == s, repr(s)


@given(st.text(max_size=60))
@settings(max_examples=150, deadline=None)
def test_bpe_round_trip_property(bpe: BPETokenizer, text: str) -> None:
    assert bpe.decode(bpe.encode(text)) == text


def test_bpe_save_load_identical(bpe: BPETokenizer, tmp_path: Path) -> None:
    (path,) = bpe.save(tmp_path)
    assert path == tmp_path / "tokenizer.model"
    loaded = BPETokenizer.load(tmp_path)
    sample = "\n".join(SHAKESPEARE) + " é\u2581 "
    assert loaded.encode(sample) == bpe.encode(sample)
    assert loaded.vocab_size == bpe.vocab_size
    assert [loaded.id_to_piece(i) for i in range(loaded.vocab_size)] == [
        bpe.id_to_piece(i) for i in range(bpe.vocab_size)
    ]
    assert pickle.loads(pickle.dumps(bpe)).encode(sample) == bpe.encode(sample)


def test_bpe_training_is_deterministic(bpe: BPETokenizer, corpus_file: Path, tmp_path: Path) -> None:
    again = BPETokenizer.train(corpus_file, BPE_VOCAB, model_dir=tmp_path / "m")
    assert again.model_proto == bpe.model_proto
    assert (tmp_path / "m" / "tokenizer.model").read_bytes() == bpe.model_proto


def test_bpe_piece_and_id_errors(bpe: BPETokenizer) -> None:
    with pytest.raises(UnknownTokenError, match="not in the vocabulary"):
        bpe.piece_to_id("definitely-not-a-piece")
    assert bpe.piece_to_id("<unk>") == 0
    with pytest.raises(TokenizerError, match=rf"token id {BPE_VOCAB} .*vocab_size {BPE_VOCAB}"):
        bpe.decode([1, BPE_VOCAB])
    with pytest.raises(TokenizerError, match="token id -2"):
        bpe.id_to_piece(-2)


@pytest.mark.parametrize("content", [b"this is not a protobuf", b"", b"\x0a\xff\xff\xff"])
def test_corrupt_model_names_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "tokenizer.model"
    path.write_bytes(content)
    with pytest.raises(TokenizerError) as info:
        BPETokenizer.load(tmp_path)
    assert str(path) in str(info.value)


def test_truncated_model_names_file(bpe: BPETokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.model"
    path.write_bytes(bpe.model_proto[: len(bpe.model_proto) // 2])
    with pytest.raises(TokenizerError, match=str(path)):
        load_tokenizer(tmp_path, "bpe")


def test_bpe_vocab_too_large_is_readable(corpus_file: Path) -> None:
    with pytest.raises(TokenizerError) as info:
        BPETokenizer.train(corpus_file, 100_000)
    msg = str(info.value)
    assert "vocab_size=100000" in msg and str(corpus_file) in msg
    assert "too high" in msg and "src/" not in msg


def test_bpe_vocab_out_of_range_names_the_bound_and_the_cli_flag_not_sentencepieces(corpus_file: Path) -> None:
    from models.bpe import BPEVocabError
    from train.data import build_tokenizer

    with pytest.raises(BPEVocabError) as small:
        BPETokenizer.train(corpus_file, 100)
    assert small.value.low > 100 and small.value.high is None
    assert str(small.value) == (f"cannot train a BPE tokenizer with vocab_size=100 on {corpus_file}: too small, this "
                                f"text needs at least {small.value.low} pieces (one per character kept, 256 byte "
                                "pieces and the control pieces)")
    assert BPETokenizer.train(corpus_file, small.value.low).vocab_size == small.value.low  # the bound is right
    with pytest.raises(ValueError) as cli:  # python -m train said "... with --character_coverage option."
        build_tokenizer("bpe", corpus_file, "", 100)
    assert str(cli.value).endswith(f": pass --bpe-vocab {small.value.low} or more")
    assert "character_coverage" not in str(cli.value)
    with pytest.raises(ValueError, match=r": too high, this text yields at most (\d+) pieces: pass --bpe-vocab \1 or less$"):
        build_tokenizer("bpe", corpus_file, "", 100_000)


def test_bpe_vocab_too_small_and_bad_inputs(corpus_file: Path, tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="vocab_size=50"):
        BPETokenizer.train(corpus_file, 50)
    with pytest.raises(TokenizerError, match="not found"):
        BPETokenizer.train(tmp_path / "missing.txt", 400)
    with pytest.raises(ValueError, match="vocab_size"):
        BPETokenizer.train(corpus_file, 0)
    with pytest.raises(ValueError, match="fixed"):
        BPETokenizer.train(corpus_file, 400, add_dummy_prefix=True)


# ----------------------------------------------------------------------------- registry


def test_load_tokenizer_both_kinds(bpe: BPETokenizer, tmp_path: Path) -> None:
    char = CharTokenizer.from_text(TEXT)
    char.save(tmp_path)
    bpe.save(tmp_path)
    loaded_char = load_tokenizer(tmp_path, "char")
    loaded_bpe = load_tokenizer(tmp_path, "bpe")
    assert isinstance(loaded_char, CharTokenizer) and isinstance(loaded_bpe, BPETokenizer)
    assert loaded_char.encode(TEXT) == char.encode(TEXT)
    assert loaded_bpe.encode(TEXT) == bpe.encode(TEXT)
    assert tokenizer_kind_files("char") == ("vocab.json",)
    assert tokenizer_kind_files("bpe") == ("tokenizer.model",)
    assert tokenizer_kind_files("gpt2") == ("tokenizer.json",)  # GPT-2 checkpoints (models.gpt2_bpe)
    assert set(TOKENIZER_KINDS) == {"char", "bpe", "gpt2"}
    assert all(TOKENIZER_KINDS[k].kind == k for k in TOKENIZER_KINDS)


@pytest.mark.parametrize(("kind", "name"), [("char", "vocab.json"), ("bpe", "tokenizer.model")])
def test_load_tokenizer_missing_file(tmp_path: Path, kind: str, name: str) -> None:
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(tmp_path, kind)
    assert str(tmp_path / name) in str(info.value)


def test_unknown_kind() -> None:
    with pytest.raises(TokenizerError, match="'wordpiece'.*bpe.*char"):
        tokenizer_kind_files("wordpiece")
    with pytest.raises(TokenizerError, match="unknown tokenizer kind"):
        load_tokenizer(".", "wordpiece")


def test_bpe_piece_with_a_space_is_found_as_sentencepiece_spells_it(bpe: BPETokenizer):
    """`--token " the"` must work on BPE checkpoints, where the piece is stored as '▁the'."""
    assert bpe.piece_to_id(" the") == bpe.piece_to_id("\u2581the")
    assert bpe.decode([bpe.piece_to_id(" the")]) == " the"
