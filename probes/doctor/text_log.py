"""A printed log's lines, streamed: what nanoGPT's and llm.c's readers iterate, in constant memory
whatever the file's length (a 2,000,000-line log is read in 1 MiB pieces, never whole).

The encoding is told from the file's start: UTF-8 (with or without its BOM), UTF-16 with its BOM
(PowerShell's `tee` and `>` write UTF-16 LE) or without one when every other byte is NUL, UTF-32
by its BOM. A file that is none of these (a NUL byte in its first line, or a tenth of its first
4 KB that is not UTF-8 text: a binary file named .log) is refused by name, never echoed. A line longer than MAX_LINE characters (no print of a trainer
is) is skipped unread, so a file with no line breaks cannot fill the memory. Excerpts shown in a
warning keep printable characters only.
"""

from __future__ import annotations

import codecs
import logging
import os
import stat
from pathlib import Path
from typing import Iterator

from probes.errors import ProbeInputError

__all__ = ["MAX_LINE", "TextLog", "check_regular_file", "excerpt", "head_lines", "text_encoding", "text_lines"]

log = logging.getLogger(__name__)

CHUNK = 1 << 18  # characters read at a time (a piece a reader takes in numpy: its temporaries stay a few MB)
MAX_LINE = 1 << 16  # characters: a longer "line" is no trainer's print
SNIFF = 4096  # bytes read to tell the encoding
NOT_TEXT = 0.1  # share of a file's first characters that are not text past which it is a binary file
# (random bytes: ~50%; a Latin-1 log's accented letters or a terminal's colour codes: a few percent)
BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_regular_file(path: Path, what: str = "a log file", reader: str = "the doctor") -> None:
    """A path that exists but is no regular file (a FIFO, /dev/zero, a socket) is refused by
    what it is, without opening it (opening a FIFO blocks until someone writes to it)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ProbeInputError(f"{path}: no such file") from None
    except OSError as err:
        raise ProbeInputError(f"{path}: cannot read ({err.strerror})") from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in KINDS if test(mode)), "not a regular file")
    raise ProbeInputError(f"{path}: {kind}, not a regular file; {reader} reads {what}")


def text_encoding(path: Path, what: str = "a printed log") -> str:
    """The codec to read `path` with (see the module's docstring); ProbeInputError for a binary file."""
    try:
        with path.open("rb") as f:
            head = f.read(SNIFF)
    except OSError as err:
        raise ProbeInputError(f"{path}: cannot read ({err.strerror})") from None
    for bom, codec in BOMS:
        if head.startswith(bom):
            return codec
    if len(head) >= 4 and head[1::2].count(0) > 0.9 * (len(head) // 2) and head[::2].count(0) < len(head) // 8:
        return "utf-16-le"  # ASCII text in UTF-16 LE without its BOM
    if len(head) >= 4 and head[::2].count(0) > 0.9 * (len(head) // 2) and head[1::2].count(0) < len(head) // 8:
        return "utf-16-be"
    nul, newline = head.find(b"\0"), head.find(b"\n")
    if nul >= 0 and (newline < 0 or nul < newline):  # junk after whole lines is a crash's padding: read on
        raise ProbeInputError(f"{path}: a binary file, not {what} (a NUL byte in its first line, "
                              "and no UTF-16/UTF-32 byte-order mark)")
    share = not_text(head)
    if share > NOT_TEXT:
        raise ProbeInputError(f"{path}: a binary file, not {what} ({share:.0%} of its first {len(head):,} bytes "
                              "are neither UTF-8 text nor line breaks or tabs)")
    return "utf-8"


def not_text(head: bytes) -> float:
    """The share of `head`'s characters that are no text: bytes that are not UTF-8 (read as U+FFFD)
    and control characters other than tabs, line breaks, backspace and ANSI colours' ESC."""
    # final=False: a character cut by the 4 KB's end is no fault
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=False)
    if not text:
        return 0.0
    bad = sum(1 for c in text if c == "\ufffd" or (c < " " and c not in "\t\n\r\f\v\b\x1b") or c == "\x7f")
    return bad / len(text)


def excerpt(text: str, n: int = 60) -> str:
    """The start of `text` with only its printable characters, for a warning."""
    shown = "".join(c if c.isprintable() else "?" for c in text[:n])
    return shown + ("..." if len(text) > n else "")


class TextLog:
    """A printed log read in pieces of whole lines (`pieces`), for readers that take a piece at a
    time; `lines` splits one, `warn` says at the end what was skipped."""

    def __init__(self, path: Path, encoding: str | None = None):
        self.path, self.encoding = path, encoding or text_encoding(path)
        self.overlong, self.tail = 0, ""

    def pieces(self) -> Iterator[tuple[int, str]]:
        """(number of its first line, text of whole lines each ending in a line break); a line
        with no break for MAX_LINE characters is dropped unread (counted) and the reading goes on
        after its end; so is the last line when it has no break (kept in `tail`)."""
        number, tail, skipping = 1, "", False
        try:
            with self.path.open("r", encoding=self.encoding, errors="replace") as f:
                while chunk := f.read(CHUNK):
                    if skipping:  # inside an overlong line: read on to its end
                        end = chunk.find("\n")
                        if end < 0:
                            continue
                        chunk, skipping = chunk[end + 1:], False
                    text = tail + chunk
                    cut = text.rfind("\n") + 1
                    tail = text[cut:]
                    if cut:
                        yield number, text[:cut]
                        number += text.count("\n", 0, cut)
                    if len(tail) > MAX_LINE:  # no line break for MAX_LINE characters: drop it
                        self.overlong += 1
                        tail, number, skipping = "", number + 1, True
        except OSError as err:
            raise ProbeInputError(f"{self.path}: cannot read ({err.strerror})") from None
        self.tail = tail

    def lines(self, number: int, text: str) -> Iterator[tuple[int, str]]:
        """(line number, line without its end) of a piece's lines from `number`, but those over
        MAX_LINE characters (counted)."""
        pieces = text.split("\n")
        pieces.pop()  # after the last line break
        for line in pieces:
            if len(line) > MAX_LINE:
                self.overlong += 1
            else:
                yield number, line
            number += 1

    def warn(self) -> None:
        if self.overlong:
            log.warning("%s: skipped %d line%s over %d characters (no trainer prints those)", self.path,
                        self.overlong, "s" if self.overlong > 1 else "", MAX_LINE)
        if self.tail.strip():
            log.warning("%s: skipped its truncated last line %r (a run killed mid-print?)", self.path,
                        excerpt(self.tail))


def text_lines(path: Path, encoding: str | None = None, warn: bool = True) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its end) of every complete line; a last line without
    its line break (a run killed mid-print) is skipped with a warning, as is a line over MAX_LINE."""
    text = TextLog(path, encoding)
    for number, piece in text.pieces():
        yield from text.lines(number, piece)
    if warn:
        text.warn()


def head_lines(path: Path, n: int, encoding: str | None = None) -> list[str]:
    """The first `n` complete lines (for telling a format from its start), without warnings."""
    out = []
    for _, line in text_lines(path, encoding, warn=False):
        out.append(line)
        if len(out) >= n:
            break
    return out
