"""The :class:`Tokenizer` interface, its errors, and the file helpers every tokenizer kind shares.

Every kind implements ``encode``, ``decode``, ``vocab_size``, ``id_to_piece``, ``piece_to_id``,
and ``save``/``load`` of its file(s) inside a checkpoint directory. The kinds themselves live
in :mod:`models.tokenizers` (character level) and :mod:`models.bpe` (SentencePiece BPE).
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from models.store.files import write_bytes_atomic

__all__ = ["Tokenizer", "TokenizerError", "UnknownTokenError", "as_id_list", "read_file",
           "write_file"]


class TokenizerError(ValueError):
    """A tokenizer file is missing or malformed, or an id/piece is invalid."""


class UnknownTokenError(TokenizerError):
    """Text or a piece that the vocabulary cannot represent."""


def write_file(path: Path, data: bytes) -> Path:
    """Write a tokenizer file atomically (temp file, fsync, rename) into an existing directory."""
    directory = path.parent
    if not directory.is_dir():
        raise NotADirectoryError(f"cannot write {path}: {directory} is not an existing directory")
    return write_bytes_atomic(path, data)


def read_file(path: Path) -> bytes:
    """The bytes of a tokenizer file; a missing or unreadable file names itself."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TokenizerError(f"{path}: file not found") from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read: {exc}") from None


def as_id_list(ids: Sequence[int]) -> list[int]:
    """Ids as plain ints (accepts lists, tuples, numpy arrays, integer tensors)."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
        if isinstance(ids, int):
            ids = [ids]
    try:
        return [operator.index(i) for i in ids]
    except TypeError as exc:
        raise TokenizerError(f"token ids must be integers: {exc}") from None


class Tokenizer(abc.ABC):
    """The interface every tokenizer kind implements."""

    kind: ClassVar[str]
    files: ClassVar[tuple[str, ...]]

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids for ``text``."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text for token ids; out-of-range ids raise :class:`TokenizerError`."""

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids (valid ids are ``0 .. vocab_size-1``)."""

    @abc.abstractmethod
    def id_to_piece(self, i: int) -> str:
        """The vocabulary entry of id ``i``."""

    @abc.abstractmethod
    def piece_to_id(self, piece: str) -> int:
        """The id of a vocabulary entry; unknown pieces raise :class:`UnknownTokenError`."""

    @abc.abstractmethod
    def save(self, directory: str | Path) -> list[Path]:
        """Write ``files`` atomically into an existing directory; return their paths."""

    @classmethod
    @abc.abstractmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        """Read the tokenizer saved in ``directory``."""

    def _check_ids(self, ids: list[int]) -> None:
        n = self.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= n):
            bad = next(i for i in ids if i < 0 or i >= n)
            raise TokenizerError(f"token id {bad} is out of range for vocab_size {n} (valid: 0..{n - 1})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"

