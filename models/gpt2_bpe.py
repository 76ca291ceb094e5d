"""GPT-2's byte-level BPE, read from the files a Hugging Face GPT-2 directory (or a user) has:
``tokenizer.json``, or ``vocab.json`` + ``merges.txt``. Stored as ``tokenizer.json`` in a snapshot.

Backed by the ``tokenizers`` library (installed with ``transformers``), the engine of Hugging
Face's fast GPT-2 tokenizer, so the ids are the same as ``GPT2Tokenizer``'s. Nothing here
downloads: without the files there is no GPT-2 tokenizer (:func:`find_gpt2_files` says None).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from models.tokenizer_base import (Tokenizer, TokenizerError, UnknownTokenError, as_id_list,
                                   read_file, write_file)

__all__ = ["GPT2BPETokenizer", "find_gpt2_files"]

TOKENIZER_JSON = "tokenizer.json"
VOCAB_JSON, MERGES_TXT = "vocab.json", "merges.txt"
END_OF_TEXT = "<|endoftext|>"  # GPT-2's one special token (id 50256 in its vocab.json)


def find_gpt2_files(directory: Path) -> list[Path] | None:
    """``[tokenizer.json]`` or ``[vocab.json, merges.txt]`` in `directory`, or None. A lone
    ``vocab.json`` is the series' character vocabulary, not GPT-2's: merges.txt tells them apart."""
    if (directory / TOKENIZER_JSON).is_file():
        return [directory / TOKENIZER_JSON]
    if (directory / VOCAB_JSON).is_file() and (directory / MERGES_TXT).is_file():
        return [directory / VOCAB_JSON, directory / MERGES_TXT]
    return None


def _backend_from_json(text: str, source: Path) -> Any:
    from tokenizers import Tokenizer as Backend  # imported on use: only GPT-2 checkpoints need it
    try:
        return Backend.from_str(text)
    except Exception as exc:  # noqa: BLE001 - a malformed file: one line naming it
        raise TokenizerError(f"{source}: not a tokenizers JSON file ({str(exc).splitlines()[0][:200]})") from None


def _backend_from_vocab_merges(vocab: Path, merges: Path) -> Any:
    """GPT-2's pipeline as Hugging Face builds it from these two files: byte-level pre-tokenizer
    (no added prefix space) and decoder around a BPE model, and `<|endoftext|>` a special token
    (its vocab.json id, or the next id where the vocabulary lacks it, as transformers adds it):
    in text it is one token, not the five pieces its characters would make."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend
    try:
        backend = Backend(models.BPE.from_file(str(vocab), str(merges)))
    except Exception as exc:  # noqa: BLE001
        raise TokenizerError(f"{vocab} + {merges}: not GPT-2 BPE files ({str(exc).splitlines()[0][:200]})") from None
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(END_OF_TEXT, special=True)])
    return backend


class GPT2BPETokenizer(Tokenizer):
    """GPT-2's byte-level BPE: any text encodes; ``decode(encode(s)) == s``."""

    kind: ClassVar[str] = "gpt2"
    files: ClassVar[tuple[str, ...]] = (TOKENIZER_JSON,)

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    @classmethod
    def from_files(cls, paths: Sequence[Path]) -> GPT2BPETokenizer:
        """From ``[tokenizer.json]`` or ``[vocab.json, merges.txt]`` (see :func:`find_gpt2_files`)."""
        if len(paths) == 1:
            return cls(_backend_from_json(read_file(paths[0]).decode("utf-8", "replace"), paths[0]))
        vocab, merges = paths
        try:
            json.loads(read_file(vocab))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{vocab}: not valid JSON: {exc}") from None
        except RecursionError:  # json's decoder recurses once per level
            raise TokenizerError(f"{vocab}: not valid JSON: nested too deep") from None
        return cls(_backend_from_vocab_merges(vocab, merges))

    @classmethod
    def load(cls, directory: str | Path) -> GPT2BPETokenizer:
        path = Path(directory) / TOKENIZER_JSON
        return cls(_backend_from_json(read_file(path).decode("utf-8", "replace"), path))

    def save(self, directory: str | Path) -> list[Path]:
        path = Path(directory) / TOKENIZER_JSON
        write_file(path, self._backend.to_str().encode("utf-8"))
        return [path]

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def special_count(self) -> int:
        """How many of the tokens are special (`<|endoftext|>`, a pad token, ...)."""
        return sum(t.special for t in self._backend.get_added_tokens_decoder().values())

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        ids = as_id_list(ids)
        self._check_ids(ids)
        return self._backend.decode(ids, skip_special_tokens=False)

    def id_to_piece(self, i: int) -> str:
        """The text of token `i` (" the", not the byte-level entry "Ġthe")."""
        i = operator.index(i)
        self._check_ids([i])
        return self._backend.decode([i], skip_special_tokens=False)

    def piece_to_id(self, piece: str) -> int:
        """The id of a vocabulary entry, written as text (" the") or as stored ("Ġthe")."""
        i = self._backend.token_to_id(piece)
        if i is None:
            ids = self.encode(piece)
            if len(ids) != 1:
                raise UnknownTokenError(f"piece {piece!r} is not one token of the vocabulary "
                                        f"({self.vocab_size} pieces): it encodes to {len(ids)} tokens")
            i = ids[0]
        return i
