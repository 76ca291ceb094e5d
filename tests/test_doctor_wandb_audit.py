"""Issue 60's audit of the W&B reader (probes.doctor.read_wandb, wandb_file): run files made by hand
here, framing and protobuf by wandb's layout (the module docstring of probes.doctor.wandb_file),
each with one fault: a run that reads, or one line and exit 2; never a traceback or a hang."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import pytest

from probes import diagnose
from probes.doctor.run_history import RunHistory

BLOCK, FULL, FIRST, MIDDLE, LAST = 32 * 1024, 1, 2, 3, 4
DEEP = b"[" * 100_000 + b"]" * 100_000  # JSON past Python's recursion limit


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:  # a length-delimited field
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def items(row: dict[str, bytes]) -> bytes:  # HistoryItem / ConfigItem: key = 1, value_json = 16
    return b"".join(field(1, field(1, k.encode()) + field(16, v)) for k, v in row.items())


def history(row: dict[str, bytes]) -> bytes:  # Record.history = 2
    return field(2, items(row))


def config(row: dict[str, bytes]) -> bytes:  # Record.config = 5
    return field(5, items(row))


def chunk(kind: int, data: bytes) -> bytes:
    return struct.pack("<IHB", zlib.crc32(bytes([kind]) + data), len(data), kind) + data


def framed(records: list[bytes], orphan: int | None = None) -> bytes:
    """A run file: the header, each record in chunks cut at 32 KiB blocks; `orphan`: a MIDDLE or
    LAST chunk with its own good CRC, its FIRST missing, after the second record."""
    out = bytearray(b":W&B" + struct.pack("<H", 0xBEE1) + b"\x00")
    for n, record in enumerate(records):
        rest, first = record, True
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < 7:
                out += bytes(left)
                continue
            part, rest = rest[:left - 7], rest[left - 7:]
            kind = (FULL if not rest else FIRST) if first else (LAST if not rest else MIDDLE)
            out += chunk(kind, part)
            first = False
            if not rest:
                break
        if n == 1 and orphan is not None:
            out += chunk(orphan, history({"iter": b"99", "train/loss": b"9.5"}))
    return bytes(out)


def rows(n: int = 12, step=lambda it: str(it).encode(), loss=lambda it: f"{3 - 0.1 * it}".encode()) -> list[bytes]:
    return [history({"iter": step(it), "train/loss": loss(it)}) for it in range(n)]


def wrong_wire_type() -> bytes:
    return varint(2 << 3 | 0) + varint(5)  # Record.history as a varint: valid framing and CRC


def write(tmp_path: Path, records: list[bytes] | None, files: dict[str, bytes] = {}, orphan=None) -> Path:
    folder = tmp_path / "wandb" / "run-20260101_000000-abc123"
    (folder / "files").mkdir(parents=True)
    if records is not None:
        (folder / "run-abc123.wandb").write_bytes(framed(records, orphan))
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


YAML_DEEP = b"n_layer: " + b"[" * 50_000 + b"]" * 50_000 + b"\n"
CASES = {  # name: (records, other files, orphan chunk) -> (steps read, records skipped) or (2, what the line says)
    "inf in the run's config": ([config({"n_layer": b"Infinity", "learning_rate": b"Infinity"}), *rows()], {}, None),
    "inf in config.yaml": (rows(), {"files/config.yaml": b"n_layer: .inf\nlearning_rate: .inf\n"}, None),
    "JSON 100k deep in a history value": ([history({"iter": b"0", "blob": DEEP}), *rows()], {}, None),
    "JSON 100k deep in the config": ([config({"blob": DEEP}), *rows()], {}, None),
    "JSON 100k deep in wandb-summary.json beside a good file": (rows(), {"files/wandb-summary.json": DEEP}, None),
    "YAML 50k deep": (rows(), {"files/config.yaml": YAML_DEEP}, None),
    "a record of the wrong wire type": ([*rows()[:3], wrong_wire_type(), *rows()[3:]], {}, None),
    "an item of the wrong wire type": ([*rows()[:3], field(2, field(1, varint(1 << 3) + varint(7))), *rows()[3:]],
                                       {}, None),
    "a LAST chunk without its FIRST": (rows(), {}, LAST),
    "a MIDDLE chunk without its FIRST": (rows(), {}, MIDDLE),
    "JSON 100k deep in wandb-summary.json alone": (None, {"files/wandb-summary.json": DEEP}, None),
    "string steps": (rows(step=lambda it: f'"{it}"'.encode()), {}, None),
    "true as a step": (rows(step=lambda it: b"true"), {}, None),
    "10.5 as a step": (rows(step=lambda it: f"{it}.5".encode()), {}, None),
}
EXPECTED = {
    "a record of the wrong wire type": (12, 1), "an item of the wrong wire type": (12, 1),
    "a LAST chunk without its FIRST": (12, 1), "a MIDDLE chunk without its FIRST": (12, 1),
    "JSON 100k deep in wandb-summary.json alone": (2, "nested deeper than Python's json reads"),
    "string steps": (2, 'its step key iter holds no whole step number (it has: "0", "1", "2")'),
    "true as a step": (2, "its step key iter holds no whole step number (it has: true, true, true)"),
    "10.5 as a step": (2, "its step key iter holds no whole step number (it has: 0.5, 1.5, 2.5)"),
}


@pytest.mark.parametrize("name", CASES)
def test_a_faulty_wandb_run_reads_or_is_one_line(tmp_path, capsys, name):
    records, files, orphan = CASES[name]
    folder = write(tmp_path, records, files, orphan)
    code = diagnose.main(["--ckpt", str(folder)])
    out, err = capsys.readouterr()
    expected = EXPECTED.get(name, (12, 0))
    if expected[0] == 2:
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and expected[1] in err, err
        return
    assert code == 0, err
    history = RunHistory.read(folder)
    assert [r["step"] for r in history.records] == list(range(expected[0]))  # the orphan's iter 99 never read
    assert history.skipped == expected[1]
    assert history.model.get("n_layers") is None and history.train_config("lr") is None  # inf: no number


def test_a_number_is_read_as_json_writes_it(tmp_path):
    weird = {3: b"4_0", 4: b" 4.0", 5: b"0x10", 6: b"1__0", 7: b"NaN", 8: b"-Infinity", 9: b"4e0"}
    records = [history({"iter": str(it).encode(), "train/loss": weird.get(it, b"2.5")}) for it in range(10)]
    losses = dict(RunHistory.read(write(tmp_path, records)).series("train_loss"))
    # "4_0", "0x10", "1__0" are no JSON: no loss at those steps; " 4.0" is JSON (whitespace), as are NaN, -Infinity
    assert sorted(losses) == [0, 1, 2, 4, 7, 8, 9] and losses[4] == 4.0 and losses[9] == 4.0
    assert losses[7] != losses[7] and losses[8] == float("-inf")


def test_a_fifo_named_as_a_run_file_is_refused_not_waited_on(tmp_path, capsys, no_hang):
    folder = write(tmp_path, None, {"files/wandb-summary.json": json.dumps({"iter": 1, "train/loss": 2}).encode()})
    os.mkfifo(folder / "run-abc123.wandb")
    assert diagnose.main(["--ckpt", str(folder)]) == 2
    assert "run-abc123.wandb: a FIFO (named pipe), not a regular file" in capsys.readouterr().err
