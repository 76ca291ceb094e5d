"""Issue 37's audit of the doctor's TensorBoard reader: damaged event files (a bad data CRC, a bad
length CRC, bytes that are no Event, a cut tail, two files one damaged) read past the damage and
said, never a verdict on a silently cut history; files that are no event file at all (text, an LFS
pointer, random bytes, empty) one line naming the file, exit 2. Damage is made in tmp_path from
files PyTorch's SummaryWriter writes; the framing (u64 length, masked CRC-32C, data, masked CRC)
is TFRecord's."""

from __future__ import annotations

import logging
import math
import struct
from pathlib import Path

import pytest

from probes import diagnose
from probes.doctor.run_history import RunHistory
from probes.doctor.tfrecord import crc32c, masked_crc32c
from test_doctor_logs import cli, one_error_line, write

pytest.importorskip("tensorboard")


def loss_at(step: int) -> float:
    """Learns from 5 to 1; NaN from step 200 on (the run diverged there)."""
    return 4.0 * math.exp(-step / 50) + 1.0 if step < 200 else math.nan


def write_run(folder: Path, steps: range = range(300)) -> Path:
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(folder))
    for step in steps:
        writer.add_scalar("train/loss", loss_at(step), step)
    writer.close()
    return next(folder.glob("events.out.tfevents.*"))


def record_offsets(data: bytes) -> list[int]:
    """Where each TFRecord starts (walking the lengths of an undamaged file)."""
    at, out = 0, []
    while at < len(data):
        out.append(at)
        at += 12 + struct.unpack_from("<Q", data, at)[0] + 4
    return out


def damaged(events: Path, fraction: float, where: str) -> int:
    """Flip one byte of the record 40% of the way in: in its data ('data') or its length ('length')."""
    data = bytearray(events.read_bytes())
    offsets = record_offsets(bytes(data))
    at = offsets[int(len(offsets) * fraction)]
    data[at + (14 if where == "data" else 0)] ^= 0x40
    events.write_bytes(bytes(data))
    return at


def test_crc32c_is_the_castagnoli_check_value():
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    assert masked_crc32c(b"") == 0xA282EAD8  # crc 0: the mask's constant alone


@pytest.mark.parametrize("where", ["data", "length"])
def test_a_damaged_record_40_percent_in_is_skipped_and_said_and_the_rest_read(tmp_path, caplog, where):
    events = write_run(tmp_path / "tb")
    at = damaged(events, 0.4, where)
    with caplog.at_level(logging.WARNING):
        d = diagnose.run(tmp_path / "tb")
    # before: 'HEALTHY (steps 0-120)' (TensorBoard's reader stops at the bad CRC)
    assert d.last_step == 299 and d.verdict == "failed" and d.skipped_records == 1
    assert next(f for f in d.findings if f.code == "divergence").step == 200
    assert "skipped" in d.format().splitlines()[0] and events.name in caplog.text
    assert (f"at byte {at}" if where == "data" else f"from byte {at}") in caplog.text
    steps = [r["step"] for r in RunHistory.read(tmp_path / "tb").records]
    assert len(steps) == 299 and 0 in steps and 299 in steps  # one step lost, not the 180 after it


def test_bytes_that_are_no_event_behind_a_good_crc_are_one_skipped_record(tmp_path, caplog):
    events = write_run(tmp_path / "tb", range(20))
    data = events.read_bytes()
    at = record_offsets(data)[5]
    junk = b"\xff" * 10  # no protobuf: a field number 0 of wire type 7
    header = struct.pack("<Q", len(junk))
    record = header + struct.pack("<I", masked_crc32c(header)) + junk + struct.pack("<I", masked_crc32c(junk))
    events.write_bytes(data[:at] + record + data[at:])
    h = RunHistory.read(tmp_path / "tb")
    assert [r["step"] for r in h.records] == list(range(20)) and h.skipped == 1


def test_a_cut_tail_is_read_up_to_the_cut_and_said(tmp_path, caplog):
    events = write_run(tmp_path / "tb", range(50))
    events.write_bytes(events.read_bytes()[:-5])
    with caplog.at_level(logging.WARNING):
        h = RunHistory.read(tmp_path / "tb")
    assert h.last_step == 48 and "truncated record" in caplog.text and h.skipped == 0


def test_two_event_files_one_damaged_the_other_whole(tmp_path):
    first = write_run(tmp_path / "tb", range(0, 100))
    second = write_run(tmp_path / "tb2", range(100, 300))
    moved = tmp_path / "tb" / (second.name + ".later")  # sorts after the first one: written later
    second.rename(moved)
    damaged(first, 0.5, "data")
    h = RunHistory.read(tmp_path / "tb")
    assert h.skipped == 1 and h.first_step == 0 and h.last_step == 299 and len(h.records) == 299


def test_a_restarted_writer_wins_its_steps(tmp_path):
    """A resumed run logs some steps again: the later value of a step is the one read."""
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(tmp_path / "tb"))
    for step in range(10):
        writer.add_scalar("loss", 3.0, step)
    for step in range(5, 12):
        writer.add_scalar("loss", 2.0, step)
    writer.close()
    at = {r["step"]: r["train_loss"] for r in RunHistory.read(tmp_path / "tb").records}
    assert at[4] == 3.0 and at[5] == 2.0 and at[11] == 2.0


@pytest.mark.parametrize("content, words", [
    (b"step,loss\n0,2.5\n1,2.4\n", "not a TensorBoard event file: no TFRecord framing in its 22 bytes "
                                   "(a text file named like one)"),
    (bytes(range(256)) * 4, "not a TensorBoard event file: no TFRecord framing in its 1024 bytes"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"a" * 64 + b"\nsize 1234\n",
     "a Git LFS pointer, not the file: run git lfs pull"),
    (b"", "the TensorBoard events hold no scalars"),
])
@pytest.mark.parametrize("how", ["--log", "--ckpt folder"])
def test_files_that_are_no_event_file_are_one_line_naming_them(tmp_path, capsys, content, words, how):
    events = tmp_path / "tb" / "events.out.tfevents.1700000000.host.1.0"
    events.parent.mkdir()
    events.write_bytes(content)
    argv = ["--log", str(events)] if how == "--log" else ["--ckpt", str(events.parent)]
    code, out, err = cli(capsys, *argv)
    line = one_error_line(err)  # before: '[Errno 22] Invalid argument' for text and the LFS pointer
    assert code == 2 and out == "" and words in line and str(events.parent) in line
    assert "\\x" not in line and "Errno" not in line


def test_a_scalar_tensor_that_is_not_one_element_is_passed_over(tmp_path):
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.summary import Writer
    from tensorboard.util import tensor_util
    writer = Writer(str(tmp_path / "tb"))
    for step in range(10):
        writer.add_scalar("loss", 3.0 - step / 10, step=step)
    writer.flush()
    events = next((tmp_path / "tb").glob("events.out.tfevents.*"))
    h = RunHistory.read(tmp_path / "tb")
    assert [round(r["train_loss"], 4) for r in h.records] == [round(3.0 - s / 10, 4) for s in range(10)]
    # a [2] tensor under the scalars plugin (a malformed writer) is no scalar: skipped, not a traceback
    from tensorboard.compat.proto import event_pb2
    value = summary_pb2.Summary.Value(tag="loss", tensor=tensor_util.make_tensor_proto([1.0, 2.0]))
    data = event_pb2.Event(step=10, summary=summary_pb2.Summary(value=[value])).SerializeToString()
    header = struct.pack("<Q", len(data))
    events.write_bytes(events.read_bytes() + header + struct.pack("<I", masked_crc32c(header)) + data
                       + struct.pack("<I", masked_crc32c(data)))
    assert RunHistory.read(tmp_path / "tb").last_step == 9


def test_a_text_event_file_beside_a_good_one_is_skipped_with_the_good_one_read(tmp_path, caplog):
    write_run(tmp_path / "tb", range(30))
    write(tmp_path / "tb" / "events.out.tfevents.9999999999.host.1.0", "not an event file\n")
    with caplog.at_level(logging.WARNING):
        h = RunHistory.read(tmp_path / "tb")
    assert h.last_step == 29 and len(h.records) == 30 and "9999999999.host.1.0 is not a TensorBoard event file" in caplog.text


def framed(events: list) -> bytes:
    out = b""
    for event in events:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        out += header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))
    return out


def scalar_event(step: int, tag: str, value: float):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    return event_pb2.Event(step=step, wall_time=1.0 + step,
                           summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)]))


@pytest.mark.parametrize("version, start, last", [("brain.Event:2", True, 7), ("brain.Event:1", False, 7),
                                                  ("brain.Event:1", True, 9)])
def test_restarts_are_dropped_as_tensorboards_own_reader_drops_them(tmp_path, version, start, last):
    """A SessionLog.START (version 2) or a step going back (version 1; there an event without
    scalars resets the newest step) makes later steps stale: the records agree with TensorBoard's
    EventAccumulator on the same file."""
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.compat.proto import event_pb2
    events = [event_pb2.Event(wall_time=0.0, file_version=version)]
    events += [scalar_event(s, "loss", 3.0 - s / 100) for s in range(10)]
    if start:
        events.append(event_pb2.Event(step=5, wall_time=20.0,
                                      session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))
    events += [scalar_event(s, "loss", 2.0 - s / 100) for s in range(5, 8)]
    folder = tmp_path / "tb"
    folder.mkdir()
    (folder / "events.out.tfevents.1.host").write_bytes(framed(events))
    acc = ea.EventAccumulator(str(folder), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    theirs = {e.step: e.value for e in acc.Scalars("loss")}  # later values of a step win, as merged
    ours = {r["step"]: r["train_loss"] for r in RunHistory.read(folder).records}
    assert ours == pytest.approx(theirs) and max(ours) == last


CORPUS = Path(__file__).resolve().parent / "data" / "doctor_logs"


@pytest.mark.parametrize("events", sorted(CORPUS.rglob("events.out.tfevents.*")), ids=lambda p: p.parent.name)
def test_corpus_event_files_read_as_tensorboards_own_reader_reads_them(events):
    from tensorboard.backend.event_processing import event_accumulator as ea
    from probes.doctor.read_tensorboard import read_scalars
    if events.read_bytes().startswith(b"version https://git-lfs"):
        pytest.skip("an LFS pointer (tested above)")
    acc = ea.EventAccumulator(str(events), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    theirs = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    ours, skipped = read_scalars(events)
    assert skipped == 0 and ours.keys() == theirs.keys()
    for tag in ours:
        assert [s for s, _ in ours[tag]] == [s for s, _ in theirs[tag]]
        assert [v for _, v in ours[tag]] == pytest.approx([v for _, v in theirs[tag]], nan_ok=True)
