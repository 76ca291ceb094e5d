"""Durable file writes and JSON reading shared by every checkpoint format.

Every write here fsyncs; whole-file writes go to a temporary name in the same directory first
and are renamed into place. Torch-free: the run doctor and the CLIs' --help import it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["CheckpointError", "check_snapshot_meta", "current_umask", "dumps_json", "fsync_dir", "fsync_file", "read_json_object",
           "refuse_unknown_fields", "sha256_of", "write_bytes_atomic", "write_error", "writing"]


class CheckpointError(ValueError):
    """A checkpoint, run directory or metrics file is missing, malformed or inconsistent."""



# --------------------------------------------------------------------------- durable writes


def write_error(exc: BaseException, where: Path, needed: int | None = None) -> CheckpointError:
    """A failed write under `where` (a run directory) in our words, naming `where`, never the
    temporary file the write went to: read-only file system, no space left (what is free, and
    `needed` bytes), permission denied, else the system's own words for the cause."""
    code = getattr(exc, "errno", None)
    if code is None:  # safetensors writes in Rust: "I/O error: ... (os error 28)"
        found = re.search(r"os error (\d+)", str(exc))
        code = int(found.group(1)) if found else None
    if code == errno.EROFS:
        return CheckpointError(f"cannot write {where}: read-only file system")
    if code in (errno.ENOSPC, errno.EDQUOT):
        need = f", a snapshot needs {megabytes(needed)}" if needed else ""
        return CheckpointError(f"no space left on the device holding {where} ({megabytes(free_bytes(where))} "
                               f"free{need})")
    if code in (errno.EACCES, errno.EPERM):
        return CheckpointError(f"cannot write {where}: permission denied")
    cause = os.strerror(code).lower() if code else (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return CheckpointError(f"cannot write {where}: {cause}")


@contextmanager
def writing(where: str | Path, needed: int | None = None) -> Iterator[None]:
    """An OSError raised by the writes inside becomes `write_error`'s one line naming `where`."""
    try:
        yield
    except OSError as exc:
        raise write_error(exc, Path(where), needed) from None


def free_bytes(where: Path) -> int:
    """Free bytes on the device holding `where` (or its nearest existing parent)."""
    for folder in (where, *where.parents):
        if folder.exists():
            return shutil.disk_usage(folder).free
    return 0


def megabytes(n: int | None) -> str:
    mb = (n or 0) / 1e6
    return f"{mb:.2f} MB" if mb < 1 else f"{mb:.1f} MB" if mb < 10 else f"{mb:,.0f} MB"


def fsync_file(path: str | Path) -> None:
    """Flush a file's contents to disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: str | Path) -> None:
    """Make renames inside a directory durable (POSIX); a no-op where directories can't be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process umask (reading it means setting it, so it is put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync, rename over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; a plain open() honours the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def _json_default(obj: Any) -> Any:
    """Tensors, numpy scalars/arrays and paths in records become plain JSON values."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def dumps_json(obj: Any, **kwargs: Any) -> str:
    return json.dumps(obj, default=_json_default, **kwargs)


def refuse_unknown_fields(data: dict[str, Any], known: Any, source: Path, what: str) -> None:
    """A CheckpointError naming the fields of `data` that are not `known`, and the known ones
    (a misspelt field must not be read as absent)."""
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise CheckpointError(f"{source}: unknown {what} field(s) {unknown}; known: {', '.join(known)}")


def check_snapshot_meta(meta: dict[str, Any], path: Path, required: Any, known: Any, version: int,
                        what: str = "") -> None:
    """A snapshot's config.json (parsed from `path`): its `required` keys, no key outside `known`,
    `format_version` equal to `version`, step and tokens seen non-negative integers (or null)."""
    missing = [key for key in required if key not in meta]
    if missing:
        raise CheckpointError(f"{path}: missing key(s) {missing}")
    refuse_unknown_fields(meta, known, path, "top-level")
    if meta["format_version"] != version:
        raise CheckpointError(f"{path}: unknown format_version {meta['format_version']!r}{what} "
                              f"(this version of scratchscope reads {version})")
    for key in ("step", "tokens_seen"):
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise CheckpointError(f"{path}: '{key}' must be a non-negative integer, got {value!r}")


def sha256_of(path: Path) -> str:
    """The file's sha256, read in 1 MiB blocks (what config.json records of a snapshot's weights)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding one object; anything else is a CheckpointError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:  # json's decoder recurses once per level
        raise CheckpointError(f"{path}: not valid JSON (nested too deep)") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


