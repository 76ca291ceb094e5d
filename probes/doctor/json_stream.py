"""A JSON object read from a file in pieces, one of its lists handed over element by element:
trainer_state.json's `log_history` (a million entries, 100 MB) is read without the file's text or
the list ever whole in memory. Each element and every other value is decoded by the standard
library's `json.JSONDecoder.raw_decode` on a window of the file; only the object's and the list's
own punctuation is parsed here. JSON's NaN and Infinity are read as Python's json reads them; an
integer over MAX_INT_DIGITS digits (Python refuses 4300) reads as a float, inf for a huge one.
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


def read_object_streaming(path: Path, list_key: str, each: Callable[[Any], None], encoding: str = "utf-8"
                          ) -> dict[str, Any]:
    """The top-level JSON object of `path`, its `list_key` list given to `each` element by element
    (the returned dict holds True for that key: the list was there); JsonStreamError when the file
    is not one JSON object, UnicodeDecodeError when it is not text, OSError when unreadable."""
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
                    read_list(window, each)
                    out[key] = True
                else:
                    out[key] = window.value()
                if window.expect(",}", "Expecting ',' delimiter") == "}":
                    break
        if window.peek():
            raise window.fail("Extra data")
        return out


def read_list(window: Window, each: Callable[[Any], None]) -> None:
    """The elements of a list whose '[' was just consumed, each given to `each`. The loop is the
    hot path of a million entries: it scans in place, and leaves an element it cannot take whole
    inside the window (at the window's edge, or bad input) to `Window` (a refill, or an error
    placed as json places it)."""
    if window.peek() == "]":
        window.pos += 1
        return
    while True:
        done = fast_elements(window, each)
        if done:
            return
        each(window.value())
        if window.expect(",]", "Expecting ',' delimiter") == "]":
            return


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
            raise window.fail("Expecting ',' delimiter")
        each(value)
        pos = after + 1
        if char == "]":
            window.pos = pos
            return True
