"""Tokenizers: character level (the series' ``vocab.json``) and SentencePiece BPE.

Both implement :class:`Tokenizer` (:mod:`models.tokenizer_base`): ``encode``, ``decode``,
``vocab_size``, ``id_to_piece``, ``piece_to_id``, and ``save``/``load`` of their file(s) inside a
checkpoint directory. This module holds :class:`CharTokenizer` and the registry of kinds
(:func:`load_tokenizer`); :class:`BPETokenizer` lives in :mod:`models.bpe` and GPT-2's
:class:`GPT2BPETokenizer` in :mod:`models.gpt2_bpe`, both re-exported here. Nothing here runs at import.
"""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from models.bpe import BPETokenizer
from models.gpt2_bpe import GPT2BPETokenizer
from models.tokenizer_base import (Tokenizer, TokenizerError, UnknownTokenError, as_id_list,
                                   read_file, write_file)

logger = logging.getLogger(__name__)

__all__ = ["TOKENIZER_KINDS", "BPETokenizer", "CharTokenizer", "GPT2BPETokenizer", "Tokenizer", "TokenizerError",
           "UnknownTokenError", "load_tokenizer", "token_piece", "tokenizer_kind_files"]

_MAX_LISTED = 5  # unknown characters named in one error message


# --------------------------------------------------------------------------- char


class CharTokenizer(Tokenizer):
    """Character-level tokenizer; one id per distinct character.

    :meth:`from_text` numbers the characters in sorted order so a rebuild is
    deterministic. The series numbered them in Python ``set`` iteration order, which
    changes between interpreter runs, so a series model must always be paired with
    the ``vocab.json`` saved beside it (:meth:`load`), never with a rebuilt vocabulary.
    """

    kind: ClassVar[str] = "char"
    files: ClassVar[tuple[str, ...]] = ("vocab.json",)

    def __init__(self, chars: Sequence[str]) -> None:
        """``chars[i]`` is the character of id ``i``."""
        chars = list(chars)
        problem = _chars_problem(chars)
        if problem:
            raise TokenizerError(f"invalid character vocabulary: {problem}")
        self._itos: list[str] = chars
        self._stoi: dict[str, int] = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """Vocabulary of the distinct characters of ``text``, in sorted order."""
        if not text:
            raise TokenizerError("cannot build a character vocabulary from empty text")
        return cls(sorted(set(text)))

    @classmethod
    def from_vocab_json(cls, path: str | Path) -> CharTokenizer:
        """Read a series-format ``vocab.json`` (``{"0": "a", "1": "b", ...}``)."""
        path = Path(path)
        try:
            pairs = json.loads(read_file(path), object_pairs_hook=_Pairs)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{path}: not valid JSON: {exc}") from None
        except RecursionError:  # json's decoder recurses once per level
            raise TokenizerError(f"{path}: not valid JSON: nested too deep") from None
        if not isinstance(pairs, _Pairs):
            raise TokenizerError(f"{path}: expected a JSON object {{\"0\": char, ...}}")
        chars, problem = _vocab_pairs_to_chars(pairs)
        if problem is None:
            problem = _chars_problem(chars)
        if problem:
            raise TokenizerError(f"{path}: {problem}")
        return cls(chars)

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        return cls.from_vocab_json(Path(directory) / cls.files[0])

    def to_vocab_json(self) -> str:
        """The series' format exactly: ``json.dump`` of ``{i: char}`` with default options."""
        return json.dumps({str(i): c for i, c in enumerate(self._itos)})

    def save(self, directory: str | Path) -> list[Path]:
        path = Path(directory) / self.files[0]
        write_file(path, self.to_vocab_json().encode("utf-8"))
        logger.debug("saved character vocabulary (%d characters) to %s", self.vocab_size, path)
        return [path]

    @property
    def vocab_size(self) -> int:
        return len(self._itos)

    @property
    def chars(self) -> tuple[str, ...]:
        """The characters in id order."""
        return tuple(self._itos)

    def encode(self, text: str) -> list[int]:
        stoi = self._stoi
        try:
            return [stoi[c] for c in text]
        except KeyError:
            raise self._unknown_error(text) from None

    def _unknown_error(self, text: str) -> UnknownTokenError:
        unknown = [(pos, c) for pos, c in enumerate(text) if c not in self._stoi]
        listed = ", ".join(f"{c!r} at position {pos}" for pos, c in unknown[:_MAX_LISTED])
        more = f" (and {len(unknown) - _MAX_LISTED} more)" if len(unknown) > _MAX_LISTED else ""
        noun, verb = ("character", "is") if len(unknown) == 1 else ("characters", "are")
        return UnknownTokenError(
            f"{noun} {listed}{more} {verb} not in the vocabulary ({self.vocab_size} characters)"
        )

    def decode(self, ids: Sequence[int]) -> str:
        ids = as_id_list(ids)
        self._check_ids(ids)
        return "".join([self._itos[i] for i in ids])

    def id_to_piece(self, i: int) -> str:
        i = operator.index(i)
        self._check_ids([i])
        return self._itos[i]

    def piece_to_id(self, piece: str) -> int:
        try:
            return self._stoi[piece]
        except KeyError:
            n = self.vocab_size
            hint = "; a character vocabulary's pieces are single characters" if len(piece) > 1 else ""
            raise UnknownTokenError(f"piece {piece!r} is not in the vocabulary ({n} characters){hint}") from None


class _Pairs(list):
    """A JSON object as its (key, value) pairs, duplicates kept."""


def _vocab_pairs_to_chars(pairs: list[tuple[Any, Any]]) -> tuple[list[str], str | None]:
    """Order vocab.json entries by id; report the first structural problem."""
    by_id: dict[int, Any] = {}
    for key, value in pairs:
        if not (key.isascii() and key.isdigit()) or key != str(int(key)):
            return [], f"key {key!r} is not a non-negative integer"
        i = int(key)
        if i in by_id:
            return [], f"id {i} appears more than once"
        by_id[i] = value
    if not by_id:
        return [], "empty vocabulary"
    missing = sorted(set(range(len(by_id))) - by_id.keys())
    if missing:
        return [], (
            f"ids must be the contiguous integers 0..{len(by_id) - 1}; "
            f"missing {missing[:_MAX_LISTED]}, largest id is {max(by_id)}"
        )
    return [by_id[i] for i in range(len(by_id))], None


def _chars_problem(chars: list[Any]) -> str | None:
    """Why ``chars`` is not a valid id->character list, or None."""
    if not chars:
        return "empty vocabulary"
    seen: dict[str, int] = {}
    for i, c in enumerate(chars):
        if not isinstance(c, str) or len(c) != 1:
            return f"id {i} maps to {c!r}, expected a single character"
        if c in seen:
            return f"character {c!r} appears twice (ids {seen[c]} and {i})"
        seen[c] = i
    return None


# --------------------------------------------------------------------------- registry

TOKENIZER_KINDS: dict[str, type[Tokenizer]] = {"char": CharTokenizer, "bpe": BPETokenizer,
                                                "gpt2": GPT2BPETokenizer}


def _tokenizer_class(kind: str) -> type[Tokenizer]:
    try:
        return TOKENIZER_KINDS[kind]
    except (KeyError, TypeError):
        known = sorted(TOKENIZER_KINDS)
        raise TokenizerError(f"unknown tokenizer kind {kind!r}; expected one of {known}") from None


def tokenizer_kind_files(kind: str) -> tuple[str, ...]:
    """The file names a tokenizer of ``kind`` writes into a snapshot directory."""
    return _tokenizer_class(kind).files


def load_tokenizer(directory: str | Path, kind: str) -> Tokenizer:
    """Load the ``kind`` tokenizer saved in ``directory`` (e.g. a snapshot)."""
    cls = _tokenizer_class(kind)
    directory = Path(directory)
    for name in cls.files:
        if not (directory / name).is_file():
            raise TokenizerError(f"{directory / name}: {kind} tokenizer file not found")
    return cls.load(directory)


def token_piece(tokenizer: Any, i: int) -> str | None:
    """The vocabulary entry of id i through our tokenizers or a HuggingFace one; None without."""
    if tokenizer is None:
        return None
    try:
        if hasattr(tokenizer, "id_to_piece"):
            return tokenizer.id_to_piece(i)
        if hasattr(tokenizer, "convert_ids_to_tokens"):
            return tokenizer.convert_ids_to_tokens(i)
        return tokenizer.decode([i])
    except (ValueError, IndexError, KeyError):
        return None  # e.g. a padded vocabulary slot (50257..50303) the tokenizer never emits
