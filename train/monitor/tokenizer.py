"""The tokenizer a user gives the Monitor (`tokenizer=`), as one of ours that a snapshot saves as data
(`models.tokenizers`), checked once at construction: never a surprise at the first save inside the loop.

    tokenizer = saveable_tokenizer(MyCharTokenizer(text), d_vocab=65)   # a CharTokenizer of its pieces

What counts, in this order:
- ours (`CharTokenizer`, `BPETokenizer`, `GPT2BPETokenizer`): as it is;
- a Hugging Face fast tokenizer (`backend_tokenizer`) or a `tokenizers.Tokenizer`: its pipeline,
  saved as `tokenizer.json` (data; the ids are its own, without added special tokens);
- a tiktoken `Encoding`: its byte-pair ranks, split pattern and special tokens rebuilt as a
  `tokenizers` byte-level BPE, checked to give tiktoken's own ids, saved as `tokenizer.json`;
- any other object with `encode` and `decode` and a vocabulary of single characters (a character
  tokenizer): its pieces in id order, read from `itos` (a list, or a dict id -> piece), `stoi` or
  `vocab` (a dict piece -> id, or a list), `chars`, or `id_to_piece(i)` / `decode([i])` for
  i < `vocab_size`; checked to encode and decode as the object does, saved as `vocab.json`.
A vocabulary of longer pieces without its merge rules cannot be encoded from data: refused, as is
anything else (a name or path given for the object, no encode/decode, more ids than the model has
logits, a tokenizer whose saved file does not read back), each in one line naming `tokenizer=`.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

from models.tokenizer_base import Tokenizer
from models.tokenizers import CharTokenizer, GPT2BPETokenizer, load_tokenizer

__all__ = ["saveable_tokenizer"]

log = logging.getLogger("train.monitor")  # said as the Monitor's own lines are

CHECK_TEXT = "Hello, world! It's 2024: naïve café — ok?\n  twice  spaced\tend"


def refuse(why: str) -> ValueError:
    return ValueError(f"Monitor: tokenizer= {why}")


def saveable_tokenizer(tokenizer: Any, d_vocab: int | None, save_every: int = 1) -> Tokenizer | None:
    """One of ours holding what `tokenizer` does, saved and read back once here; ValueError (one
    line) for what a snapshot cannot save as data, for more ids than the model's d_vocab logits, or
    for a tokenizer whose own code raises as it is read (naming what raised).
    With save_every=0 nothing saves it: a warning says so (Monitor.save(step) still can)."""
    if tokenizer is None:
        return None
    if not save_every:
        log.warning("monitor: tokenizer= is saved with each snapshot, and save_every=0 saves none (only a "
                    "call to Monitor.save(step) would)")
    name = type(tokenizer).__name__
    try:
        ours = as_ours(tokenizer)
        size = their(name, "vocab_size", lambda: ours.vocab_size)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 - their code, wherever it raised: one line naming it
        raise refuse(f"is a {name} that raised {said(err)} as the Monitor read it") from None
    if d_vocab is not None and size > d_vocab:
        raise refuse(f"has {size} ids, more than the model's {d_vocab} logits: text would encode to ids "
                     "the model cannot read (is it the model's own tokenizer?)")
    return read_back(ours, type(tokenizer).__name__)


def as_ours(tokenizer: Any) -> Tokenizer:
    name = type(tokenizer).__name__
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, bytes, os.PathLike)):
        raise refuse(f"is a {name} ({str(tokenizer)[:60]!r}): give the tokenizer object itself (with encode and "
                     "decode), not its name or path")
    backend = their(name, "backend_tokenizer", lambda: getattr(tokenizer, "backend_tokenizer", None))  # HF fast
    if backend is None and callable(getattr(tokenizer, "to_str", None)) and hasattr(tokenizer, "get_vocab_size"):
        backend = tokenizer  # a tokenizers.Tokenizer itself
    if backend is not None:
        return GPT2BPETokenizer(backend)
    if type(tokenizer).__module__.split(".")[0] == "tiktoken":
        from train.monitor.tiktoken_reader import tiktoken_as_ours
        return tiktoken_as_ours(tokenizer)
    if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))):
        raise refuse(f"is a {name}, which has no encode and decode: give the tokenizer that turns your text into "
                     "the model's ids")
    if their(name, "convert_ids_to_tokens", lambda: hasattr(tokenizer, "convert_ids_to_tokens")):
        raise refuse(f"is a slow Hugging Face {name}: give its fast version (AutoTokenizer.from_pretrained(..., "
                     "use_fast=True, trust_remote_code=False)), whose tokenizer.json a snapshot saves")
    return char_tokenizer(tokenizer, name)


def said(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:100]}"


def their(name: str, what: str, read: Any) -> Any:
    """`read()` of the user's tokenizer; what it raises is one line naming the tokenizer and `what`."""
    try:
        return read()
    except Exception as err:  # noqa: BLE001 - their code
        raise refuse(f"is a {name} whose {what} raised {said(err)}") from None


def pieces_of(tokenizer: Any) -> list[Any] | None:
    """The vocabulary in id order from the attributes a hand-written tokenizer has; None if none."""
    name = type(tokenizer).__name__
    for attr in ("itos", "stoi", "vocab", "chars"):
        table = their(name, attr, lambda: getattr(tokenizer, attr, None))
        if isinstance(table, dict) and table:
            keys_are_ids = all(isinstance(k, int) for k in table)
            by_id = table if keys_are_ids else {i: p for p, i in table.items()}
            if not all(isinstance(i, int) for i in by_id) or sorted(by_id) != list(range(len(by_id))):
                return None  # ids with gaps or of other types: no order to save
            return [by_id[i] for i in range(len(by_id))]
        if isinstance(table, (list, tuple, str)) and len(table):
            return list(table)
    size = their(name, "vocab_size", lambda: getattr(tokenizer, "vocab_size", None))
    size = their(name, "vocab_size()", size) if callable(size) else size
    if isinstance(size, int) and 0 < size <= 1 << 20:
        one = their(name, "id_to_piece", lambda: getattr(tokenizer, "id_to_piece", None))
        what = "id_to_piece(i)" if callable(one) else "decode([i])"
        return their(name, what, lambda: [one(i) if callable(one) else tokenizer.decode([i]) for i in range(size)])
    return None


def char_tokenizer(tokenizer: Any, name: str) -> CharTokenizer:
    pieces = pieces_of(tokenizer)
    if pieces is None:
        raise refuse(f"is a {name} with encode and decode but no vocabulary a snapshot can save: give it `itos` "
                     "(its pieces in id order), `stoi`, `vocab`, or `id_to_piece` and `vocab_size`")
    long = next((i for i, p in enumerate(pieces) if not (isinstance(p, str) and len(p) == 1)), None)
    if long is not None:
        raise refuse(f"is a {name} whose piece {long} is {pieces[long]!r}, not one character: a vocabulary of longer "
                     "pieces cannot be encoded from data without its merges; give a Hugging Face fast tokenizer or "
                     "a tiktoken Encoding built from yours")
    try:
        ours = CharTokenizer(pieces)
    except ValueError as err:
        raise refuse(f"is a {name} whose vocabulary is not a character table: {err}") from None
    every = "".join(pieces)
    try:
        same = list(tokenizer.encode(every)) == list(range(len(pieces))) and tokenizer.decode(list(range(len(pieces)))) == every
    except Exception as err:  # noqa: BLE001 - their code, said in one line
        raise refuse(f"is a {name} whose encode/decode failed on its own {len(pieces)} characters "
                     f"({said(err)})") from None
    if not same:
        raise refuse(f"is a {name} whose encode/decode do not map each character of its vocabulary to its id: "
                     "a snapshot would read text otherwise than your model was trained on")
    return ours


def read_back(ours: Tokenizer, name: str) -> Tokenizer:
    """Saved in a scratch folder and read back as a snapshot will: a save that raises, or a file
    that reads back otherwise, is refused now rather than at the first save inside the loop."""
    try:
        with tempfile.TemporaryDirectory(prefix="scratchscope-tokenizer-") as folder:
            ours.save(folder)
            again = load_tokenizer(folder, ours.kind)
    except Exception as err:  # noqa: BLE001 - whatever its save raises, said in one line
        raise refuse(f"({name}) could not be saved and read back as a snapshot saves it: {type(err).__name__}: "
                     f"{(str(err).strip().splitlines() or [''])[0][:160]}") from None
    sample = CHECK_TEXT
    try:
        expected = ours.encode(sample)
    except ValueError:  # a character vocabulary without these characters: its own pieces
        sample = "".join(ours.id_to_piece(i) for i in range(min(ours.vocab_size, 256)))
        expected = ours.encode(sample)
    if again.vocab_size != ours.vocab_size or again.encode(sample) != expected:
        raise refuse(f"({name}) reads back from its saved file with other ids: it cannot be saved as data")
    return ours
