"""nanochat's tokenizer, read without unpickling: ``<base>/tokenizer/tokenizer.pkl`` is a pickled
tiktoken ``Encoding`` (nanochat's ``RustBPETokenizer.save``: ``pickle.dump(self.enc, f)``). Its
opcodes are walked here by a small stack machine that knows only what such a pickle holds (pickle
protocol 3 or later): one reference to ``tiktoken.core.Encoding``, made with no arguments, then
given a state dict of plain data: ``name`` and ``pat_str`` (str), ``mergeable_ranks``
(bytes -> int) and ``special_tokens`` (str -> int). From that data the Encoding is built with
``tiktoken.Encoding(name, pat_str=..., mergeable_ranks=..., special_tokens=...)``.

Why it cannot run code: nothing in the file is ever imported, looked up or called. The global
reference is compared as two strings and stands on the stack as a marker; the only opcodes
accepted push str, bytes, int, tuple, dict and that marker, or read and write the memo; every
opcode that calls something (REDUCE, INST, OBJ, NEWOBJ_EX, EXT*, persistent ids) is refused, and
NEWOBJ and BUILD are accepted on the marker only, where they record data. The one call made is
ours, to tiktoken's constructor, with values whose types were checked. Torch-free.
"""

from __future__ import annotations

import io
import pickletools
from pathlib import Path
from typing import Any, Sequence

from models.tokenizer_base import Tokenizer, TokenizerError, UnknownTokenError, as_id_list

__all__ = ["NanochatTokenizer", "TokenizerFileError", "read_encoding_state"]

ENCODING = ("tiktoken.core", "Encoding")
MAX_BYTES = 256 * 2**20  # a 65k-token tokenizer.pkl is about 1 MB
MAX_VALUES = 2**22  # values the state holds, each memo reference counted again (a 65k-token state: ~130k)
MAX_DEPTH = 16  # nesting of tuples and dicts (nanochat's state: 2)
PLAIN = {"PROTO", "FRAME", "STOP", "MARK", "EMPTY_DICT", "EMPTY_TUPLE", "SETITEM", "SETITEMS", "MEMOIZE",
         "BINPUT", "LONG_BINPUT", "PUT", "BINGET", "LONG_BINGET", "GET", "SHORT_BINUNICODE", "BINUNICODE",
         "BINUNICODE8", "UNICODE", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BININT", "BININT1", "BININT2",
         "LONG1", "LONG4", "INT", "LONG", "TUPLE1", "TUPLE2", "TUPLE3", "TUPLE", "GLOBAL", "STACK_GLOBAL",
         "NEWOBJ", "BUILD"}


class TokenizerFileError(ValueError):
    """tokenizer.pkl is not a tiktoken Encoding of plain data: one line naming the file."""


class _Marker:
    """tiktoken's Encoding class as named in the file (never imported), then the object made of it."""

    def __init__(self) -> None:
        self.made, self.state = False, None


_MARK = object()  # pickle's MARK on our stack


def read_encoding_state(path: Path) -> dict[str, Any]:
    """The state dict of the tiktoken Encoding pickled in `path`, types checked; TokenizerFileError
    (one line) for any other pickle, a damaged one, or a file that is not a pickle."""
    try:
        data = path.read_bytes() if path.stat().st_size <= MAX_BYTES else None
    except OSError as exc:
        raise TokenizerFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if data is None:
        raise TokenizerFileError(f"{path}: larger than {MAX_BYTES >> 20} MB: not a tokenizer")
    try:
        state = _walk(data)
    except TokenizerFileError as exc:
        raise TokenizerFileError(f"{path}: {exc} (only a pickled tiktoken Encoding of plain data is read "
                                 "here, and nothing in it is run)") from None
    except (ValueError, IndexError, KeyError, TypeError, EOFError) as exc:  # pickletools on a damaged file
        why = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerFileError(f"{path}: damaged or not a pickle ({why})") from None
    return _checked(state, path)


def _walk(data: bytes) -> Any:
    """Run the opcodes of `data` on a stack of plain values; returns what STOP finds."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    ledger = _Ledger()
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        name = op.name
        if name not in PLAIN:
            raise TokenizerFileError(f"refused: opcode {name} (it would call or build an object)")
        if name == "PROTO" and arg < 3:
            raise TokenizerFileError(f"refused: pickle protocol {arg} (nanochat writes 3 or later)")
        if name == "STOP":
            if len(stack) != 1:
                raise TokenizerFileError("damaged: the stack is not one value at STOP")
            return stack[0]
        _step(name, arg, stack, memo, ledger)
    raise TokenizerFileError("damaged: no STOP")


class _Ledger:
    """How many values each tuple and dict holds, counting a memo reference again each time it is
    used, and how deep it nests: 60 tuples each holding the previous one twice are 700 bytes and
    2**60 values, which anything that walks them (str, ==, tiktoken) would never finish."""

    def __init__(self) -> None:
        self.sizes: dict[int, tuple[int, int]] = {}  # id -> (values, depth)
        self.alive: list[Any] = []  # keeps the ids above from being reused

    def size(self, value: Any) -> tuple[int, int]:
        return self.sizes.get(id(value), (1, 0))

    def grow(self, container: Any, items: Sequence[Any]) -> None:
        count, depth = self.sizes.get(id(container), (1, 1))
        for item in items:
            n, d = self.size(item)
            count, depth = count + n, max(depth, d + 1)
        if count > MAX_VALUES:
            raise TokenizerFileError(f"refused: its state would hold more than {MAX_VALUES} values "
                                     "(memo references repeated)")
        if depth > MAX_DEPTH:
            raise TokenizerFileError(f"refused: its state nests deeper than {MAX_DEPTH} levels")
        if id(container) not in self.sizes:
            self.alive.append(container)
        self.sizes[id(container)] = (count, depth)


def _step(name: str, arg: Any, stack: list[Any], memo: dict[int, Any], ledger: _Ledger) -> None:
    if name in ("PROTO", "FRAME"):
        return
    if name == "MARK":
        stack.append(_MARK)
    elif name in ("GLOBAL", "STACK_GLOBAL"):
        module, qualname = arg.split(" ", 1) if name == "GLOBAL" else (stack.pop(-2), stack.pop())
        if (module, qualname) != ENCODING:
            raise TokenizerFileError(f"refused: it names {f'{module}.{qualname}'!r}, not tiktoken.core.Encoding")
        stack.append(_Marker())
    elif name == "NEWOBJ":
        args, cls = stack.pop(), stack.pop()
        if not isinstance(cls, _Marker) or cls.made or args != ():
            raise TokenizerFileError("refused: NEWOBJ on something other than tiktoken's Encoding")
        cls.made = True
        stack.append(cls)
    elif name == "BUILD":
        state, obj = stack.pop(), stack[-1]
        if not isinstance(obj, _Marker) or not obj.made or obj.state is not None:
            raise TokenizerFileError("refused: BUILD on something other than tiktoken's Encoding")
        obj.state = state
    elif name in ("EMPTY_DICT", "EMPTY_TUPLE"):
        stack.append({} if name == "EMPTY_DICT" else ())
    elif name in ("SETITEM", "SETITEMS"):
        items = [stack.pop(), stack.pop()][::-1] if name == "SETITEM" else _to_mark(stack)
        target = stack[-1]
        if not isinstance(target, dict) or len(items) % 2:
            raise TokenizerFileError(f"damaged: {name} on a {type(target).__name__}")
        for key, value in zip(items[::2], items[1::2]):
            if not isinstance(key, (str, bytes, int)):
                raise TokenizerFileError(f"refused: a dict key of type {type(key).__name__}")
            target[key] = value
        ledger.grow(target, items)
    elif name.startswith("TUPLE"):
        items = _to_mark(stack) if name == "TUPLE" else [stack.pop() for _ in range(int(name[-1]))][::-1]
        stack.append(tuple(items))
        ledger.grow(stack[-1], items)
    elif name in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"):
        memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
    elif name in ("BINGET", "LONG_BINGET", "GET"):
        stack.append(memo[arg])
    else:  # str, bytes and int literals: pickletools has decoded them already
        stack.append(arg)


def _to_mark(stack: list[Any]) -> list[Any]:
    """The values above the topmost MARK, popped with it."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1:]
            del stack[i:]
            return items
    raise TokenizerFileError("damaged: no MARK")


def _checked(found: Any, path: Path) -> dict[str, Any]:
    if not isinstance(found, _Marker):
        raise TokenizerFileError(f"{path}: holds a {type(found).__name__}, not a pickled tiktoken Encoding")
    if not isinstance(found.state, dict):  # a str: tiktoken's registered encoding by name (a download)
        what = (f"pickled by reference ({found.state[:40]!r})" if isinstance(found.state, str)
                else f"whose state is a {type(found.state).__name__}")  # never formatted: it may never end
        raise TokenizerFileError(f"{path}: a tiktoken Encoding {what}, not the ranks, pattern and special tokens "
                                 "nanochat's tok_train saves")
    state = found.state
    if set(state) != {"name", "pat_str", "mergeable_ranks", "special_tokens"}:
        raise TokenizerFileError(f"{path}: a tiktoken Encoding whose state has keys {sorted(map(str, state))}, "
                                 "not name, pat_str, mergeable_ranks and special_tokens")
    ranks, special = state["mergeable_ranks"], state["special_tokens"]
    fine = (isinstance(state["name"], str) and isinstance(state["pat_str"], str) and isinstance(ranks, dict)
            and all(isinstance(k, bytes) and type(v) is int for k, v in ranks.items()) and isinstance(special, dict)
            and all(isinstance(k, str) and type(v) is int for k, v in special.items()))
    if not fine:
        raise TokenizerFileError(f"{path}: its Encoding state is not str name and pattern, bytes -> int ranks and "
                                 "str -> int special tokens")
    missing = next((b for b in range(256) if bytes([b]) not in ranks), None)
    if missing is not None:  # tiktoken would panic (a Rust panic) on the first text holding that byte
        raise TokenizerFileError(f"{path}: mergeable_ranks has no rank for the byte 0x{missing:02x}: a byte-level "
                                 "BPE ranks all 256 bytes")
    return state


def load_encoding(path: Path) -> Any:
    """tiktoken's Encoding built from the plain data of `path`; ImportError without tiktoken."""
    state = read_encoding_state(path)
    import tiktoken

    try:
        return tiktoken.Encoding(state["name"], pat_str=state["pat_str"], mergeable_ranks=state["mergeable_ranks"],
                                 special_tokens=state["special_tokens"])
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a bad pattern, ranks that collide; a Rust panic is a BaseException
        raise TokenizerFileError(f"{path}: tiktoken refuses its data ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _tiktoken(call: Any, folder: Path, what: str) -> Any:
    """`call()` into tiktoken, whose Rust panics (a pattern that backtracks past its limit, an id
    with no bytes) are BaseExceptions nothing else catches: a TokenizerError in one line."""
    try:
        return call()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - pyo3's PanicException derives from BaseException
        raise TokenizerError(f"{folder / 'tokenizer.pkl'}: tiktoken failed to {what} ({_first_line(exc)})") from None


class NanochatTokenizer(Tokenizer):
    """nanochat's tokenizer (a tiktoken Encoding) in our interface, encoding as nanochat's
    ``RustBPETokenizer.encode`` does: ordinary text, no BOS."""

    kind = "nanochat"
    files = ("tokenizer.pkl",)

    def __init__(self, encoding: Any, folder: Path) -> None:
        self.encoding = encoding
        self.folder = folder

    def encode(self, text: str) -> list[int]:
        return list(_tiktoken(lambda: self.encoding.encode_ordinary(text), self.folder, "encode the text"))

    def decode(self, ids: Sequence[int]) -> str:
        ids = as_id_list(ids)
        self._check_ids(ids)
        return _tiktoken(lambda: self.encoding.decode(ids), self.folder, "decode the ids")

    @property
    def vocab_size(self) -> int:
        return int(self.encoding.n_vocab)

    def id_to_piece(self, i: int) -> str:
        self._check_ids([i])
        return self.decode([int(i)])  # as nanochat's id_to_token

    def piece_to_id(self, piece: str) -> int:
        ids = self.encode(piece)
        if len(ids) != 1:
            raise UnknownTokenError(f"{piece!r} is not one token of this vocabulary")
        return int(ids[0])

    def save(self, directory: str | Path) -> list[Path]:
        raise TokenizerError("nanochat's tokenizer is saved by nanochat (RustBPETokenizer.save)")

    @classmethod
    def load(cls, directory: str | Path) -> NanochatTokenizer:
        raise TokenizerError("nanochat's tokenizer is loaded with the checkpoint (models.store.nanochat)")
