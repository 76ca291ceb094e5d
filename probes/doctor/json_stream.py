"""A JSON object read from a file in pieces, one of its lists handed over element by element:
trainer_state.json's `log_history` (a million entries, 100 MB) is read without the file's text or
the list ever whole in memory. Each element and every other value is decoded by the standard
library's `json.JSONDecoder.raw_decode` on a window of the file; only the object's and the list's
own punctuation is parsed here. JSON's NaN and Infinity are read as Python's json reads them; an
integer over MAX_INT_DIGITS digits (Python refuses 4300) reads as a float, inf for a huge one.
Given `many`, a window's whole elements are decoded at once (`bulk_elements`, the hot path of a
long list), their ints as json.loads reads them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, TextIO

__all__ = ["JsonStreamError", "read_object_streaming"]

CHUNK = 1 << 20  # characters read at a time
MAX_INT_DIGITS = 40
SPACE = re.compile(r"[ \t\n\r]*")


KINDS = (("[", "list"), ('"', "str"), ("-0123456789NI", "number"), ("tf", "bool"), ("n", "null"))


class JsonStreamError(ValueError):
    """The file is not the JSON expected; `str` says what and where (line, column)."""


def big_int(text: str) -> int | float:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else float(text)


DECODER = json.JSONDecoder(parse_int=big_int)
PLAIN = json.JSONDecoder()  # bulk_elements': ints by C, as json.loads reads them (big_int is a call per int)


class Window:
    """The part of the file not yet consumed, refilled as the parse moves on."""

    def __init__(self, f: TextIO):
        self.f, self.buf, self.pos, self.eof = f, "", 0, False
        self.line, self.line_start = 1, 0  # line number at buf[0]; absolute offset where that line starts
        self.base = 0  # absolute offset of buf[0]

    def fill(self) -> None:
        """Drop what was consumed, read more (at least as much as is held: a big value doubles)."""
        done = self.buf[:self.pos]
        newlines = done.count("\n")
        if newlines:
            self.line += newlines
            self.line_start = self.base + done.rfind("\n") + 1
        self.base += self.pos
        chunk = self.f.read(max(CHUNK, len(self.buf) - self.pos))
        self.eof = not chunk
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0

    def where(self, pos: int | None = None) -> str:
        pos = self.pos if pos is None else pos
        before = self.buf[:pos]
        line, start = self.line + before.count("\n"), self.line_start
        if "\n" in before:
            start = self.base + before.rfind("\n") + 1
        return f"line {line}, column {self.base + pos - start + 1}"

    def fail(self, what: str, pos: int | None = None) -> JsonStreamError:
        return JsonStreamError(f"{what} at {self.where(pos)}")

    def peek(self) -> str:
        """The next character after white space ('' at the end of the file)."""
        while True:
            self.pos = SPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or self.eof:
                return self.buf[self.pos] if self.pos < len(self.buf) else ""
            self.fill()

    def expect(self, chars: str, what: str) -> str:
        char = self.peek()
        if not char or char not in chars:
            raise self.fail(f"{what}, found {'the end of the file' if not char else repr(char)}")
        self.pos += 1
        return char

    def value(self) -> Any:
        """The next JSON value, whole (read on until it is: a number may go on past the window)."""
        self.peek()
        while True:
            try:
                value, end = DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if self.eof:
                    raise self.fail(err.msg, err.pos) from None
                self.fill()
                continue
            if end == len(self.buf) and not self.eof:
                self.fill()
                continue
            self.pos = end
            return value


def read_object_streaming(path: Path, list_key: str, each: Callable[[Any], None], encoding: str = "utf-8",
                          many: Callable[[list[Any]], None] | None = None) -> dict[str, Any]:
    """The top-level JSON object of `path`, its `list_key` list given to `each` element by element,
    or, when `many` is given, mostly to `many` a window's elements at a time, in order (the
    returned dict holds True for that key: the list was there); JsonStreamError when the file is
    not one JSON object, UnicodeDecodeError when it is not text, OSError when unreadable."""
    with path.open("r", encoding=encoding) as f:
        window = Window(f)
        found = window.peek()
        if found != "{":
            kind = next((name for starts, name in KINDS if found and found in starts), None)
            if kind:
                raise JsonStreamError(f"not a JSON object (a {kind})")
            raise window.fail("Expecting value" if found else "Expecting value: the file is empty")
        window.pos += 1
        out: dict[str, Any] = {}
        if window.peek() == "}":
            window.pos += 1
        else:
            while True:
                if window.peek() != '"':
                    raise window.fail("Expecting property name enclosed in double quotes")
                key = window.value()
                window.expect(":", "Expecting ':' delimiter")
                if key == list_key and window.peek() == "[":
                    window.pos += 1
                    read_list(window, each, many)
                    out[key] = True
                else:
                    out[key] = window.value()
                if window.expect(",}", "Expecting ',' delimiter") == "}":
                    break
        if window.peek():
            raise window.fail("Extra data")
        return out


def read_list(window: Window, each: Callable[[Any], None], many: Callable[[list[Any]], None] | None = None) -> None:
    """The elements of a list whose '[' was just consumed, given to `each` (or in bulk to `many`).
    The loop is the hot path of a million entries: the window's whole elements are decoded at
    once (`bulk_elements`), else scanned in place one by one; an element it cannot take whole
    (at the window's edge, or bad input) is left to `Window` (a refill, or an error placed as
    json places it)."""
    if window.peek() == "]":
        window.pos += 1
        return
    while True:
        if many is not None and (taken := bulk_elements(window, many)) is not None:
            if taken:
                return
            if not window.eof:  # the rest of the window is the start of an element: read on
                window.fill()
                continue
        done = fast_elements(window, each)
        if done:
            return
        each(window.value())
        if window.expect(",]", "Expecting ',' delimiter") == "]":
            return


def bulk_elements(window: Window, many: Callable[[list[Any]], None]) -> bool | None:
    """The window's elements up to its last '},' decoded as one list and given to `many` (their
    ints as json.loads reads them: one over MAX_INT_DIGITS stays an int here); True when the
    list's ']' came first (then every element to it), False when it goes on. None, taking
    nothing, when that text is no list of whole elements (an element cut by the window, or bad input: the caller
    reads on element by element, and says where it is bad). A '},' cut inside an element or a
    string leaves brackets or a string open, so a list that decodes holds whole elements only."""
    buf, pos = window.buf, window.pos
    cut = buf.rfind("},", pos)
    if cut < 0:
        return None
    text = "[" + buf[pos:cut + 1] + "]"
    try:
        values, end = PLAIN.raw_decode(text)
    except ValueError:  # bad JSON (json.JSONDecodeError), or an int over Python's 4300 digits
        return None
    many(values)
    if end == len(text):
        window.pos = cut + 2  # after the comma: the next element's start
        return False
    window.pos = pos + end - 1  # after the list's own ']'
    return True


def fast_elements(window: Window, each: Callable[[Any], None]) -> bool:
    """Elements and their delimiters taken from the window as long as each lies inside it; True
    at the list's ']'. Leaves window.pos at the next element's start."""
    scan, space = DECODER.scan_once, SPACE.match
    buf, pos = window.buf, window.pos
    limit = len(buf) - 1  # an element must end before the window's last character to be whole
    while True:
        start = space(buf, pos).end()
        try:
            value, end = scan(buf, start)
        except (StopIteration, json.JSONDecodeError):
            window.pos = start
            return False
        after = space(buf, end).end()
        if end >= limit or after >= len(buf):
            window.pos = start
            return False
        char = buf[after]
        if char not in ",]":
            window.pos = after
            raise window.fail(f"Expecting ',' delimiter, found {char!r}")  # as Window.expect says it
        each(value)
        pos = after + 1
        if char == "]":
            window.pos = pos
            return True
