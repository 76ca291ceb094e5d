"""A run directory that cannot be written (read-only file system, full disk, no permission) is one
line in our words naming the run, never Python's [Errno 30] text or a hidden temporary path.
Tests run as root, where chmod stops no write: the writes are made to fail as the kernel would."""

from __future__ import annotations

import errno
import re

import pytest
import torch

from models import build_model, get_preset
from models.store.files import CheckpointError, write_error, writing
from models.store.run import append_metrics, write_run_json
from models.store.snapshot import save_snapshot, snapshot_bytes

READ_ONLY = OSError(errno.EROFS, "Read-only file system")
FULL = OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def model():
    return build_model(get_preset("transformer4_rms_small", d_vocab=8))


def test_the_causes_in_our_words(tmp_path):
    assert str(write_error(READ_ONLY, tmp_path)) == f"cannot write {tmp_path}: read-only file system"
    full = str(write_error(FULL, tmp_path / "not" / "yet", needed=3_500_000))
    assert re.fullmatch(rf"no space left on the device holding {tmp_path}/not/yet \([\d.,]+ MB free, a snapshot "
                        r"needs 3.5 MB\)", full), full
    assert str(write_error(OSError(errno.EACCES, "x"), tmp_path)) == f"cannot write {tmp_path}: permission denied"
    rust = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")  # safetensors
    assert str(write_error(rust, tmp_path)).startswith(f"no space left on the device holding {tmp_path} (")
    assert str(write_error(OSError(errno.EIO, "x"), tmp_path)) == f"cannot write {tmp_path}: input/output error"


@pytest.mark.parametrize("failure, expected", [
    (READ_ONLY, "cannot write {run}: read-only file system: snapshot step_000500 not saved; any earlier snapshot is intact"),
    (FULL, "no space left on the device holding {run} ("),
])
def test_a_snapshot_that_cannot_be_written_names_the_run_not_the_temporary_directory(
        model, tmp_path, monkeypatch, failure, expected):
    import models.store.snapshot as snapshot

    run = tmp_path / "run"
    save_snapshot(run / "step_000000", model, None)

    def fail(*args, **kwargs):
        raise OSError(failure.errno, failure.strerror, str(run / ".step_000500.tmp-6633" / "model.safetensors"))

    monkeypatch.setattr(snapshot, "save_file", fail)
    with pytest.raises(CheckpointError) as info:
        save_snapshot(run / "step_000500", model, None)
    message = str(info.value)
    assert message.startswith(expected.format(run=run)) and ".tmp" not in message and "Errno" not in message
    if failure is FULL:
        needed = snapshot_bytes(model) / 1e6
        assert f"a snapshot needs {needed:.2f} MB" in message
    assert sorted(p.name for p in run.iterdir()) == ["step_000000"]  # nothing left behind


def test_a_snapshot_counts_the_optimizer_state_it_carries(model):
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()
    assert snapshot_bytes(model, optimizer) == pytest.approx(3 * snapshot_bytes(model), rel=0.01)  # weights, m, v


@pytest.mark.parametrize("write", [lambda run: append_metrics(run, {"step": 0}),
                                   lambda run: write_run_json(run, {"preset": None})])
def test_run_files_on_a_read_only_file_system(tmp_path, monkeypatch, write):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "run" / ".run.json.x.tmp"))

    monkeypatch.setattr("builtins.open", read_only)
    monkeypatch.setattr("tempfile.mkstemp", read_only)
    with pytest.raises(CheckpointError, match=f"^cannot write {tmp_path / 'run'}: read-only file system$"):
        write(tmp_path / "run")


def test_training_into_a_read_only_run_directory_is_one_line(tmp_path, monkeypatch, capsys):
    import train.run_lock as run_lock
    from train.loop import main

    data = tmp_path / "t.txt"
    data.write_text("the king and the queen.\n" * 40)

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(run_lock.os, "open", read_only)  # the lock file, the run's first write
    out = tmp_path / "run"
    assert main(["--preset", "transformer4_rms_small", "--data", str(data), "--out", str(out), "-q"]) == 2
    assert capsys.readouterr().err == f"error: cannot write {out}: read-only file system\n"


def test_writing_passes_other_errors_through(tmp_path):
    with pytest.raises(KeyError):
        with writing(tmp_path):
            raise KeyError("not a write")
