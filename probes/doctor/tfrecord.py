"""TFRecord framing, the container of TensorBoard's event files, walked record by record so that
one damaged record costs that record, not the rest of the file.

Each record is: a u64 length, a u32 masked CRC-32C of those 8 bytes, the data, a u32 masked
CRC-32C of the data (all little-endian). A record whose length checks out but whose data fails
its CRC is skipped and the next one read; a length that fails its CRC cannot be trusted, so the
walk looks for the next offset whose 12 header bytes check out (a false match has odds of 2^-32)
and reads on from there. What was skipped is counted in `Damage`, for the reader to say.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, TypeVar

__all__ = ["Damage", "masked_crc32c", "walk_records"]

T = TypeVar("T")

HEADER = 12  # u64 length + u32 length CRC
FOOTER = 4  # u32 data CRC


def _table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # CRC-32C (Castagnoli), reflected
        table.append(crc)
    return table


CRC_TABLE = _table()


def crc32c(data: bytes) -> int:
    crc, table = 0xFFFFFFFF, CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits plus a constant (so CRCs of CRCs differ)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@dataclass
class Damage:
    """What a walk over one file skipped: records failing their data CRC (or `check`), byte
    ranges with no valid framing, and a last record cut short."""

    bad_records: list[int] = field(default_factory=list)  # byte offsets of records skipped
    lost_bytes: list[tuple[int, int]] = field(default_factory=list)  # (offset, length) skipped unframed
    cut_at: int | None = None  # offset of an incomplete last record
    size: int = 0
    records: int = 0  # records read whole

    @property
    def any(self) -> bool:
        return bool(self.bad_records or self.lost_bytes or self.cut_at is not None)

    def text(self) -> str:
        """'1 damaged record skipped (at byte 5123 of 12800)', or '' when the file was whole."""
        parts = []
        if self.bad_records:
            n = len(self.bad_records)
            parts.append(f"{n} damaged record{'s' if n > 1 else ''} skipped (failing its CRC; the first at byte "
                         f"{self.bad_records[0]} of {self.size})")
        if self.lost_bytes:
            lost = sum(n for _, n in self.lost_bytes)
            parts.append(f"{lost} bytes with no valid record framing skipped (from byte {self.lost_bytes[0][0]})")
        if self.cut_at is not None:
            parts.append(f"it ends in a truncated record at byte {self.cut_at} (a run killed mid-write?)")
        return "; ".join(parts)


def header_ok(view: mmap.mmap | bytes, at: int) -> int | None:
    """The data length of a record header at `at` whose CRC checks out, else None."""
    head = view[at:at + HEADER]
    if len(head) < HEADER:
        return None
    (length,) = struct.unpack_from("<Q", head)
    (crc,) = struct.unpack_from("<I", head, 8)
    return length if masked_crc32c(head[:8]) == crc else None


def resync(view: mmap.mmap | bytes, start: int, size: int) -> int | None:
    """The next offset after `start` holding a header that checks out and fits in the file. Only
    offsets whose length's high 4 bytes are zero are tried (no event is 4 GiB): found with
    `find`, so a text file is passed over at C speed."""
    at = start
    while at + HEADER <= size:
        zeros = view.find(b"\0\0\0\0", at + 4, size)
        if zeros < 0:
            return None
        at = zeros - 4
        length = header_ok(view, at)
        if length is not None and at + HEADER + length + FOOTER <= size:
            return at
        at += 1
    return None


def walk_records(path: Path, damage: Damage, parse: Callable[[bytes], T | None]) -> Iterator[T]:
    """`parse(data)` of each record of `path` whose framing checks out. `parse` returns None for
    a record that does not matter (its CRC is then not checked: the pure-Python CRC costs ~0.1 us
    a byte, and an image summary's megabytes are not read here) and raises ValueError for data it
    cannot read, counted as a damaged record like one failing its CRC."""
    size = damage.size = path.stat().st_size
    if size == 0:
        return
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        at = 0
        while at < size:
            length = header_ok(view, at)
            if length is None:
                if size - at < HEADER:
                    damage.cut_at = at
                    return
                found = resync(view, at + 1, size)
                damage.lost_bytes.append((at, (size if found is None else found) - at))
                if found is None:
                    return
                at = found
                continue
            end = at + HEADER + length
            if end + FOOTER > size:
                damage.cut_at = at
                return
            data = view[at + HEADER:end]
            try:
                item = parse(data)
                if item is not None and masked_crc32c(data) != struct.unpack_from("<I", view, end)[0]:
                    raise ValueError("data CRC")
            except ValueError:
                damage.bad_records.append(at)
            else:
                damage.records += 1
                if item is not None:
                    yield item
            at = end + FOOTER
