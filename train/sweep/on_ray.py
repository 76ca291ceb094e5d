"""The Ray backend of `train.sweep`: each grid point is a Ray task (num_cpus=1) that runs the same
`python -m train` process the local backend runs, on whichever node Ray picks.

The cluster: `--ray-address`, else $RAY_ADDRESS (an existing cluster; our packages travel with the
job as py_modules), else a local Ray started for the sweep (num_cpus = --workers) and stopped after
it. A driver that already called `ray.init` keeps its own.

Where the runs land: a task that sees SWEEP_DIR (shared storage: the same path from the driver's
working directory, holding this sweep's sweep.json) trains straight into it; any other trains into
a temporary folder on its node, with the data shipped to it, and returns the run folder as a
gzipped tar that the driver unpacks into SWEEP_DIR. `--ray-storage shared|copy` forces one way.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import socket
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from models.interrupts import EXIT_INTERRUPTED
from train.sweep.book import Job
from train.sweep.local import POLL_S, Ended, Started, launch, train_argv

log = logging.getLogger("train.sweep")

__all__ = ["STORAGE", "ray_session", "run_ray", "sees_sweep", "train_task", "unpack"]

STORAGE = ("auto", "shared", "copy")
CANCEL_WAIT_S = 60.0  # after Ctrl-C, how long tasks get to stop their runs (each saves a snapshot)
CONNECT_WAIT_S = 5.0  # how long a cluster address gets to answer one TCP connect


# ------------------------------------------------------------------ on the worker


def sees_sweep(spec: dict[str, Any]) -> bool:
    """Does this node see the driver's SWEEP_DIR (its sweep.json with this sweep's id) and data?"""
    cwd = Path(spec["cwd"])
    try:
        book = json.loads((cwd / spec["sweep_dir"] / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return book.get("id") == spec["id"] and (cwd / spec["data"]).is_file()


def code_path() -> str:
    """PYTHONPATH for the run's process: wherever this worker imports our packages from (Ray's
    py_modules unpack each package into a folder of its own)."""
    import models
    import probes
    import train

    return os.pathsep.join(dict.fromkeys(str(Path(m.__file__).resolve().parent.parent) for m in (models, probes, train)))


def train_task(spec: dict[str, Any], data: bytes | None) -> dict[str, Any]:
    """Run one point's `python -m train` (the Ray task's body); a cancel (KeyboardInterrupt) is
    passed on to the run as SIGINT, so it saves a snapshot and stops."""
    shared = spec["storage"] == "shared" or (spec["storage"] == "auto" and sees_sweep(spec))
    if spec["storage"] == "shared" and not sees_sweep(spec):
        raise RuntimeError(f"--ray-storage shared: {socket.gethostname()} does not see {spec['sweep_dir']}")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="scratchscope-sweep-") as tmp:
        cwd = spec["cwd"] if shared else tmp
        data_path = spec["data"] if shared else copied_data(spec["data"], data, Path(tmp))
        out = spec["out"] if shared else spec["name"]  # relative to cwd, or absolute
        log_path = Path(cwd, spec["log"] if shared else "train.log")
        shutil.rmtree(Path(cwd, out), ignore_errors=True)  # a retried task starts its run afresh
        proc = launch(train_argv(data_path, spec["argv"], out), log_path, cwd=cwd, code=code_path())
        try:  # polled: Ray's cancel arrives as an exception between bytecodes, which a blocking
            while (code := proc.poll()) is None:  # wait() (one waitpid syscall) would hold until the run ends
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        result = {"code": code, "seconds": time.monotonic() - t0, "node": socket.gethostname(),
                  "shared": shared, "run": None, "log": None}
        if not shared:
            result["run"] = pack(Path(tmp, out)) if Path(tmp, out).is_dir() else None
            result["log"] = log_path.read_bytes() if log_path.is_file() else None
        return result


def copied_data(name: str, data: bytes | None, tmp: Path) -> str:
    """Write the shipped data under `tmp` by its relative name (so run.json names the same file)."""
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        rel = Path("data") / rel.name
    if data is None:
        raise RuntimeError(f"{socket.gethostname()} does not see {name} and the data was not shipped")
    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp / rel).write_bytes(data)
    return str(rel)


def pack(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        tar.add(folder, arcname=".")
    return buffer.getvalue()


# ------------------------------------------------------------------ on the driver


def unpack(blob: bytes, run_dir: Path) -> None:
    """A run folder sent back by a task, into place: unpacked beside it, then renamed in."""
    staging = run_dir.parent / f".{run_dir.name}.unpack-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(staging, filter="data")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.replace(staging, run_dir)


def check_reachable(address: str, timeout: float = CONNECT_WAIT_S) -> None:
    """One line at once for a cluster address nothing answers at (Ray itself retries for ever):
    `host:port` and `ray://host:port` are tried with one TCP connect; `auto` is Ray's to find."""
    if address == "auto" or address.startswith("local"):
        return
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--backend ray: {address!r} is not a cluster address (HOST:PORT, ray://HOST:PORT or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise ValueError(f"--backend ray: no Ray cluster answers at {address} ({err.strerror or err}); "
                         "start one (ray start --head) or unset RAY_ADDRESS for a local Ray") from None


@contextmanager
def ray_session(cpus: int, address: str | None) -> Iterator[None]:
    """Connected to the cluster at `address` / $RAY_ADDRESS, or to a fresh local Ray of `cpus` CPUs
    (stopped on the way out); a driver that already called ray.init keeps its own."""
    try:
        import ray
    except ImportError:
        raise ValueError("--backend ray needs Ray: pip install 'scratchscope[ray]' (or pip install ray)") from None
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    quiet = dict(logging_level=logging.WARNING, log_to_driver=False)
    if address:
        check_reachable(address)
    try:
        if address:
            import models
            import probes
            import train

            ray.init(address=address, runtime_env={"py_modules": [models, probes, train]}, **quiet)
        else:
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, **quiet)
    except ConnectionError as err:
        raise ValueError(f"--backend ray: {err}") from None
    try:
        yield
    finally:
        ray.shutdown()


def run_ray(jobs: list[Job], spec: Callable[[Job], dict[str, Any]], data: bytes | None, in_flight: int,
            started: Started, ended: Ended) -> None:
    """Train `jobs` as Ray tasks (inside `ray_session`), at most `in_flight` submitted at once;
    runs come back as the local backend's do. On Ctrl-C the tasks are cancelled (each run saves
    its snapshot) before KeyboardInterrupt goes on."""
    import ray

    task = ray.remote(num_cpus=1)(train_task)
    shipped = ray.put(data)
    waiting, live = list(jobs), {}
    try:
        while waiting or live:
            while waiting and len(live) < in_flight:
                job = waiting.pop(0)
                live[task.remote(spec(job), shipped)] = (job, time.monotonic())
                started(job)
            ready, _ = ray.wait(list(live), num_returns=1)
            job, t0 = live.pop(ready[0])
            ended(job, *collect(ready[0], job, t0))
    except KeyboardInterrupt:
        cancel(live, ended)
        raise


def collect(ref: Any, job: Job, t0: float) -> tuple[int | None, float, str | None]:
    """A finished task's (exit code, seconds, error); a copied run unpacked into SWEEP_DIR."""
    import ray

    try:
        result = ray.get(ref)
    except ray.exceptions.TaskCancelledError:  # our own Ctrl-C: the run saved and said so in its log
        return None, time.monotonic() - t0, None
    except ray.exceptions.RayError as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[-1]
        log.warning("sweep: %s: the Ray task failed: %s", job.name, reason)
        return None, time.monotonic() - t0, f"Ray task failed: {reason}"
    if result["run"] is not None:
        unpack(result["run"], job.out)
    if result["log"] is not None:
        job.log.write_bytes(result["log"])
    return result["code"], result["seconds"], None


def cancel(live: dict[Any, tuple[Job, float]], ended: Ended) -> None:
    import ray

    for ref in live:
        ray.cancel(ref)
    ready, _ = ray.wait(list(live), num_returns=len(live), timeout=CANCEL_WAIT_S)
    for ref, (job, t0) in live.items():
        code, seconds, _ = collect(ref, job, t0) if ref in ready else (None, time.monotonic() - t0, None)
        ended(job, EXIT_INTERRUPTED if code is None else code, seconds)
