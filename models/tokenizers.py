"""Tokenizers: character level (the series' ``vocab.json``) and SentencePiece BPE.

Both implement :class:`Tokenizer`: ``encode``, ``decode``, ``vocab_size``,
``id_to_piece``, ``piece_to_id``, and ``save``/``load`` of their file(s) inside a
checkpoint directory. Nothing here runs at import.
"""

from __future__ import annotations

import abc
import contextlib
import io
import json
import logging
import operator
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import sentencepiece as spm

logger = logging.getLogger(__name__)

_MAX_LISTED = 5  # unknown characters named in one error message


class TokenizerError(ValueError):
    """A tokenizer file is missing or malformed, or an id/piece is invalid."""


class UnknownTokenError(TokenizerError):
    """Text or a piece that the vocabulary cannot represent."""


def _atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temp file in the same directory, fsync, rename."""
    directory = path.parent
    if not directory.is_dir():
        raise NotADirectoryError(f"cannot write {path}: {directory} is not an existing directory")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # make the rename durable too (POSIX only)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def _read_file(path: Path) -> bytes:
    """The bytes of a tokenizer file; a missing or unreadable file names itself."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TokenizerError(f"{path}: file not found") from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read: {exc}") from None


def _as_id_list(ids: Sequence[int]) -> list[int]:
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
            pairs = json.loads(_read_file(path), object_pairs_hook=_Pairs)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{path}: not valid JSON: {exc}") from None
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
        _atomic_write_bytes(path, self.to_vocab_json().encode("utf-8"))
        logger.info("saved character vocabulary (%d characters) to %s", self.vocab_size, path)
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
        ids = _as_id_list(ids)
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
            raise UnknownTokenError(f"piece {piece!r} is not in the vocabulary ({n} characters)") from None


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


# --------------------------------------------------------------------------- BPE

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
            raise TokenizerError(
                f"cannot train a BPE tokenizer with vocab_size={vocab_size} on {text_file}: "
                f"{_sentencepiece_message(exc)}"
            ) from None
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
        return cls(_read_file(path), source=str(path))

    def save(self, directory: str | Path) -> list[Path]:
        path = Path(directory) / self.files[0]
        _atomic_write_bytes(path, self.model_proto)
        logger.info("saved BPE tokenizer (vocab_size=%d) to %s", self.vocab_size, path)
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
        ids = _as_id_list(ids)
        self._check_ids(ids)
        return self._sp.decode(ids)

    def id_to_piece(self, i: int) -> str:
        i = operator.index(i)
        self._check_ids([i])
        return self._sp.id_to_piece(i)

    def piece_to_id(self, piece: str) -> int:
        i = self._sp.piece_to_id(piece)
        if i == self._unk_id and piece != self._sp.id_to_piece(i):
            raise UnknownTokenError(f"piece {piece!r} is not in the vocabulary ({self.vocab_size} pieces)")
        return i

    def __getstate__(self) -> dict[str, Any]:
        return {"proto": self.model_proto, "source": self._source}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["proto"], source=state["source"])  # type: ignore[misc]


def _sentencepiece_message(exc: BaseException) -> str:
    """SentencePiece's error text without its ``INTERNAL: src/x.cc(1) [check]`` prefix."""
    text = str(exc).strip()
    if "] " in text:
        text = text.split("] ", 1)[1].strip() or text
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------------------- registry

TOKENIZER_KINDS: dict[str, type[Tokenizer]] = {"char": CharTokenizer, "bpe": BPETokenizer}


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
