"""The framing of a W&B run file (`run-<id>.wandb`), walked record by record without wandb, and a
small protobuf wire-format decoder for what is inside.

The layout, as wandb writes it (its Go core, format version 0):
    7-byte header: b":W&B", a u16 magic 0xBEE1, a u8 version
    then LevelDB's log framing: the file is cut in 32 KiB blocks (counted from byte 0, the header
    in the first); each chunk is a u32 CRC, a u16 length and a u8 type (FULL, FIRST, MIDDLE,
    LAST), then its data; a block's tail too short for a chunk header (7 bytes) is zero padding.
The CRC is zlib's CRC-32 of the type byte and the data, not masked (checked on files wandb 0.31
wrote). The chunks of one record join into one serialized protobuf `Record`.

A file cut inside its last record (a run still writing, or killed) ends the walk quietly; a
chunk failing its CRC costs the rest of its block (LevelDB's own reader does the same), counted; so
does a MIDDLE or LAST chunk whose FIRST is missing (its record is lost). Only a regular file is
opened (a FIFO named run-x.wandb would block the open forever).
"""

from __future__ import annotations

import mmap
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from probes.doctor.text_log import check_regular_file
from probes.errors import ProbeInputError

__all__ = ["FORMAT_VERSION", "Walk", "fields", "message_fields", "varint", "walk_wandb_records"]

IDENT, MAGIC, FORMAT_VERSION = b":W&B", 0xBEE1, 0
FILE_HEADER = 7
BLOCK = 32 * 1024
CHUNK_HEADER = 7  # u32 crc, u16 length, u8 type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class Walk:
    """What walking one file met: records read whole, chunks skipped as damaged, a cut end."""

    records: int = 0
    damaged: int = 0  # blocks whose rest was skipped (a CRC or a chunk type that does not fit), records without their start
    first_damage: int | None = None  # byte offset of the first
    cut_at: int | None = None  # offset of a record the file ends inside (still being written?)

    def damaged_text(self) -> str:
        if not self.damaged:
            return ""
        n = self.damaged
        return (f"{n} damaged block{'s' if n > 1 else ''} skipped (failing its CRC, or a record's chunks "
                f"without its first; the first at byte {self.first_damage})")

    def damage(self, at: int) -> None:
        self.damaged += 1
        self.first_damage = at if self.first_damage is None else self.first_damage


def check_header(path: Path, head: bytes) -> None:
    """One line for a file that is not a W&B run file of the version read here."""
    if not head:
        raise ProbeInputError(f"{path}: an empty file: wandb has written nothing to it (yet)")
    if not IDENT.startswith(head[:4]) or len(head) >= 6 and struct.unpack_from("<H", head, 4)[0] != MAGIC:
        raise ProbeInputError(f"{path}: not a W&B run file (it does not start with W&B's ':W&B' header)")
    if len(head) < FILE_HEADER:
        raise ProbeInputError(f"{path}: a W&B run file cut inside its {FILE_HEADER}-byte header "
                              f"({len(head)} bytes): nothing logged yet")
    if head[6] != FORMAT_VERSION:
        raise ProbeInputError(f"{path}: a W&B run file of format version {head[6]}; this reader knows version "
                              f"{FORMAT_VERSION} (written by a newer wandb?)")


def walk_wandb_records(path: Path, walk: Walk) -> Iterator[bytes]:
    """The serialized `Record`s of a run file, in order. ProbeInputError for an empty file, a
    file of another kind or another format version; a cut end stops quietly (`walk.cut_at`)."""
    check_regular_file(path, "a W&B run file")  # a FIFO's open would wait forever
    size = path.stat().st_size
    with path.open("rb") as f:
        check_header(path, f.read(FILE_HEADER))
        if size == FILE_HEADER:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            yield from records_of(view, size, walk)


def records_of(view: mmap.mmap, size: int, walk: Walk) -> Iterator[bytes]:
    at, parts, start = FILE_HEADER, [], None  # parts: the chunks of a record begun (FIRST, MIDDLE)
    resyncing = False  # after a skipped block: the chunks ending its record are no new damage
    while at < size:
        left_in_block = BLOCK - at % BLOCK
        if left_in_block < CHUNK_HEADER:  # the block's zero padding
            at += left_in_block
            continue
        if at + CHUNK_HEADER > size:
            walk.cut_at = start if start is not None else at
            return
        crc, length, kind = struct.unpack_from("<IHB", view, at)
        end = at + CHUNK_HEADER + length
        if end > size:
            walk.cut_at = start if start is not None else at
            return
        if length > left_in_block - CHUNK_HEADER or zlib.crc32(view[at + 6:end]) != crc or not FULL <= kind <= LAST:
            if crc == 0 and length == 0 and kind == 0:  # zeros to the end of a block (a preallocated tail)
                at += left_in_block
                continue
            walk.damage(at)
            parts, start, resyncing = [], None, True
            at += left_in_block  # the rest of the block cannot be trusted: resync on the next one
            continue
        data = view[at + CHUNK_HEADER:end]
        if kind == FULL or kind == FIRST:
            if parts:  # a record begun and never ended: its chunks were lost
                walk.damage(start)
            parts, start, resyncing = ([], None, False) if kind == FULL else ([data], at, False)
            if kind == FULL:
                walk.records += 1
                yield data
        elif parts:
            parts.append(data)
            if kind == LAST:
                walk.records += 1
                yield b"".join(parts)
                parts, start = [], None
        elif not resyncing:  # a MIDDLE or LAST without its FIRST: a record lost (not the skipped block's own)
            walk.damage(at)
            resyncing = True
        at = end
    if parts:
        walk.cut_at = start


# ---------------------------------------------------------------------- protobuf wire format

def varint(data: bytes, at: int) -> tuple[int, int]:
    """(value, next offset) of the varint at `at`; ValueError past the end or past 10 bytes."""
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint runs past its field")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def fields(data: bytes, wanted: frozenset[int] | None = None) -> dict[int, list[int | bytes]]:
    """{field number: [values]} of one protobuf message: varints as ints, length-delimited and
    fixed-width fields as bytes (fixed64 as its 8 bytes: read with struct where wanted). Only the
    numbers in `wanted` are kept (all when None); others are stepped over. ValueError for bytes
    that are no message (a wire type 3/4/6/7, a length past the end)."""
    out: dict[int, list[int | bytes]] = {}
    at, end = 0, len(data)
    while at < end:
        key = data[at]
        if key < 0x80:  # the usual one-byte key (fields 1-15); the same for lengths below 128
            at += 1
        else:
            key, at = varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(data, at)
        elif wire == 2:
            length = data[at] if at < end else 0x80
            if length < 0x80:
                at += 1
            else:
                length, at = varint(data, at)
            if at + length > end:
                raise ValueError(f"field {number}: {length} bytes past the end of its message")
            value, at = data[at:at + length], at + length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if at + width > end:
                raise ValueError(f"field {number}: cut short")
            value, at = data[at:at + width], at + width
        else:
            raise ValueError(f"wire type {wire} (field {number}) is not one this reader knows")
        if wanted is None or number in wanted:
            out.setdefault(number, []).append(value)
    return out


def message_fields(data: bytes, wanted: frozenset[int]) -> dict[int, list[bytes]]:
    """`fields` of a message whose wanted fields all hold bytes (messages, strings, fixed64):
    ValueError for one of another wire type (a varint where a message belongs)."""
    found = fields(data, wanted)
    for number, values in found.items():
        if any(not isinstance(v, bytes) for v in values):
            raise ValueError(f"field {number}: a varint where a message or string belongs")
    return found  # type: ignore[return-value]
