"""SentencePiece BPE tokenizer, stored as ``tokenizer.model`` in a checkpoint directory.

:meth:`BPETokenizer.train` fixes the trainer settings that make ``decode(encode(s)) == s``
for every string. Also importable as ``models.tokenizers.BPETokenizer``.
"""

from __future__ import annotations

import io
import logging
import operator
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import sentencepiece as spm

from models.tokenizer_base import (Tokenizer, TokenizerError, UnknownTokenError, as_id_list,
                                   read_file, write_file)

logger = logging.getLogger("models.tokenizers")  # the name it always logged under

__all__ = ["BPETokenizer", "BPEVocabError"]

# Trainer settings fixed so that decode(encode(text)) == text for any text.
_BPE_FIXED_OPTIONS: dict[str, Any] = {
    "model_type": "bpe",
    "normalization_rule_name": "identity",  # no NFKC: text is kept byte for byte
    "remove_extra_whitespaces": False,  # keep runs of spaces, leading/trailing spaces
    "add_dummy_prefix": False,  # no invented leading space (GPT-2 style " the" vs "the")
    "byte_fallback": True,  # any character encodes (as UTF-8 byte pieces): no <unk>
    "user_defined_symbols": ["\n"],  # a newline is one piece, "\n", never merged
}

_META = "\u2581"  # SentencePiece's whitespace symbol; a literal one would decode as " "


class BPEVocabError(TokenizerError):
    """vocab_size does not fit the training text: `low` / `high` is the bound it must meet."""

    def __init__(self, message: str, vocab_size: int, low: int | None = None, high: int | None = None):
        super().__init__(message)
        self.vocab_size, self.low, self.high = vocab_size, low, high


class BPETokenizer(Tokenizer):
    """SentencePiece BPE tokenizer stored as ``tokenizer.model`` (the model proto).

    Trained by :meth:`train` with settings that make ``decode(encode(s)) == s`` exact
    for every string: identity normalisation, whitespace kept as is, no dummy prefix,
    byte fallback, ``"\\n"`` as its own piece (SentencePiece trains line by line, so
    newlines would otherwise only ever be byte pieces), and a literal U+2581 ("▁")
    encoded as its UTF-8 bytes so it does not come back as a space. Models trained
    elsewhere (e.g. with the default NFKC normalisation) load and work, but their
    round trip is only as exact as their own settings allow.
    """

    kind: ClassVar[str] = "bpe"
    files: ClassVar[tuple[str, ...]] = ("tokenizer.model",)

    def __init__(self, model_proto: bytes, *, source: str = "<model proto>") -> None:
        """Parse a serialized SentencePiece model; ``source`` names it in errors."""
        if not model_proto:
            raise TokenizerError(f"{source}: empty SentencePiece model")
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(model_proto)
        except (RuntimeError, OSError) as exc:
            raise TokenizerError(f"{source}: not a valid SentencePiece model ({exc})") from None
        if sp.get_piece_size() == 0:
            raise TokenizerError(f"{source}: SentencePiece model has no pieces")
        self._sp, self._source, self._unk_id = sp, source, sp.unk_id()
        ids = [sp.piece_to_id(f"<0x{b:02X}>") for b in _META.encode("utf-8")]
        # byte pieces for a literal U+2581; None when the model has no byte fallback
        self._meta_ids = ids if all(sp.is_byte(i) for i in ids) else None

    @classmethod
    def train(
        cls,
        text_file: str | Path,
        vocab_size: int,
        *,
        model_dir: str | Path | None = None,
        character_coverage: float = 1.0,
        num_threads: int = 1,
        max_sentence_length: int = 1 << 16,
        input_sentence_size: int = 0,
        **trainer_options: Any,
    ) -> BPETokenizer:
        """Train on the lines of a UTF-8 text file; save into ``model_dir`` if given.

        ``vocab_size`` counts 3 control pieces, 256 byte pieces and the newline piece,
        so it must exceed 260 plus the number of distinct characters kept.
        ``input_sentence_size=0`` uses every line (no sampling); lines longer than
        ``max_sentence_length`` bytes are skipped by SentencePiece. Extra
        ``trainer_options`` go to ``SentencePieceTrainer.train`` unchanged.
        """
        text_file = Path(text_file)
        if not text_file.is_file():
            raise TokenizerError(f"{text_file}: training text file not found")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        clash = sorted(set(trainer_options) & (set(_BPE_FIXED_OPTIONS) | {"input", "model_writer"}))
        if clash:
            raise ValueError(f"trainer options {clash} are fixed by BPETokenizer.train")
        options = {
            **_BPE_FIXED_OPTIONS,
            "character_coverage": character_coverage,
            "num_threads": num_threads,
            "max_sentence_length": max_sentence_length,
            "input_sentence_size": input_sentence_size,
            "minloglevel": 2,  # keep SentencePiece's own logging off stderr
            **trainer_options,
        }
        start = time.perf_counter()
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                input=str(text_file), vocab_size=vocab_size, model_writer=model, **options)
        except RuntimeError as exc:
            raise _training_error(exc, vocab_size, text_file) from None
        tok = cls(model.getvalue(), source=f"BPE model trained on {text_file}")
        seconds = time.perf_counter() - start
        logger.info("trained BPE tokenizer: vocab_size=%d on %s in %.2fs", vocab_size, text_file, seconds)
        if model_dir is not None:
            Path(model_dir).mkdir(parents=True, exist_ok=True)
            tok.save(model_dir)
        return tok

    @classmethod
    def load(cls, directory: str | Path) -> BPETokenizer:
        path = Path(directory) / cls.files[0]
        return cls(read_file(path), source=str(path))

    def save(self, directory: str | Path) -> list[Path]:
        path = Path(directory) / self.files[0]
        write_file(path, self.model_proto)
        logger.debug("saved BPE tokenizer (vocab_size=%d) to %s", self.vocab_size, path)
        return [path]

    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece model (the bytes of ``tokenizer.model``)."""
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        sp = self._sp
        if self._meta_ids is None or _META not in text:
            ids = sp.encode(text)
        else:
            ids = []
            for k, part in enumerate(text.split(_META)):
                if k:
                    ids.extend(self._meta_ids)
                ids.extend(sp.encode(part))
        if self._meta_ids is None and self._unk_id in ids:
            raise UnknownTokenError(
                f"text contains characters this model cannot encode "
                f"({ids.count(self._unk_id)} <unk> tokens; it has no byte fallback)"
            )
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        ids = as_id_list(ids)
        self._check_ids(ids)
        return self._sp.decode(ids)

    def id_to_piece(self, i: int) -> str:
        i = operator.index(i)
        self._check_ids([i])
        return self._sp.id_to_piece(i)

    def piece_to_id(self, piece: str) -> int:
        """Id of a piece; a space may be written as itself (" the") or as SentencePiece's "▁the"."""
        i = self._sp.piece_to_id(piece)
        if i == self._unk_id and " " in piece:
            i = self._sp.piece_to_id(piece.replace(" ", "\u2581"))
        if i == self._unk_id and piece != self._sp.id_to_piece(i):
            raise UnknownTokenError(f"piece {piece!r} is not in the vocabulary ({self.vocab_size} pieces)")
        return i

    def __getstate__(self) -> dict[str, Any]:
        return {"proto": self.model_proto, "source": self._source}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["proto"], source=state["source"])  # type: ignore[misc]


def _training_error(exc: BaseException, vocab_size: int, text_file: Path) -> TokenizerError:
    """SentencePiece's refusal in our words: a vocab_size outside what the text allows names the
    bound (its own text suggests a --character_coverage flag that no CLI of ours has)."""
    text = _sentencepiece_message(exc)
    start = f"cannot train a BPE tokenizer with vocab_size={vocab_size} on {text_file}"
    small = re.search(r"smaller than required_chars\. \d+ vs (\d+)", text)
    if small:
        low = int(small.group(1))
        return BPEVocabError(f"{start}: too small, this text needs at least {low} pieces (one per "
                             "character kept, 256 byte pieces and the control pieces)", vocab_size, low=low)
    large = re.search(r"too high \(\d+\)\. Please set it to a value <= (\d+)", text)
    if large:
        high = int(large.group(1))
        return BPEVocabError(f"{start}: too high, this text yields at most {high} pieces", vocab_size, high=high)
    return TokenizerError(f"{start}: {text}")


def _sentencepiece_message(exc: BaseException) -> str:
    """SentencePiece's error text without its ``INTERNAL: src/x.cc(1) [check]`` prefix."""
    text = str(exc).strip()
    if "] " in text:
        text = text.split("] ", 1)[1].strip() or text
    return text.splitlines()[0] if text else type(exc).__name__
