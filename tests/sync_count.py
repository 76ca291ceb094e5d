"""Host syncs counted on a CPU: what would make Python wait for the GPU if the tensors lived there.

On a CPU nothing waits, so what is counted is the operations that WOULD sync on CUDA (there
`torch.cuda.set_sync_debug_mode` flags them; `benchmarks/bench_monitor.py --device cuda` uses it):

1. an aten op that hands data to Python or sizes its output by the data: those PyTorch tags
   `data_dependent_output` (`_local_scalar_dense`, which `item()`, `float()`, `int()` and
   `bool()` of a tensor go through; `equal`, `allclose`) or `dynamic_output_shape` (`nonzero`,
   `masked_select`, indexing with a bool mask, `unique`, `repeat_interleave` by a tensor);
2. a copy to the host: `.cpu()`, `.to("cpu")` (blocking or not: each transfer counts once), and
   `.tolist()` / `.numpy()` of a tensor that is not such a copy. Here the model's device IS the
   CPU, so `.to(t.device)` (a `torch.device` looked up from a tensor: where the model lives) is
   not counted; the host is named as a string, "cpu", or by `non_blocking=True` to the CPU.

Reading a host copy afterwards (its `tolist()`, `float()` of an element) is free, as it is on a
GPU. Conservative where a CPU cannot tell: a tensor the code made on the host itself and reads
back is counted too. A `.cpu()` of a tensor already there returns a clone here, so that the copy
and the original stay apart.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

SYNC_TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)


def names_the_host(args: tuple, kwargs: dict) -> bool:
    """Whether a `.to(...)` call moves a tensor to the host: "cpu" as a string, or non_blocking to the CPU."""
    device, _, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
    if device is None or device.type != "cpu":
        return False
    named = [a for a in (*args, kwargs.get("device")) if isinstance(a, str)]
    return non_blocking or any(name.startswith("cpu") for name in named)


class HostSyncs(TorchDispatchMode):
    """`with HostSyncs() as syncs: ...`; then `syncs.total` and `syncs.counts` (by what synced)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._host: set[int] = set()  # storage addresses of host copies (kept alive by their holders)
        self._saved: dict[str, Any] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _on_host(self, tensor: torch.Tensor) -> bool:
        return getattr(tensor, "_host_copy", False) or tensor.untyped_storage().data_ptr() in self._host

    def _host_copy(self, original: torch.Tensor, copy: torch.Tensor, how: str) -> torch.Tensor:
        if self._on_host(original):
            return copy
        self.counts[how] += 1
        if copy.untyped_storage().data_ptr() == original.untyped_storage().data_ptr():
            with torch._C.DisableTorchFunction():
                copy = copy.clone()  # a real transfer makes a new tensor: keep the original a "device" one
        self._host.add(copy.untyped_storage().data_ptr())  # its views too, while this count lasts
        copy._host_copy = True  # itself, in later counts too (a copy read a step later)
        return copy

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(tag in func.tags for tag in SYNC_TAGS):
            inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if not all(self._on_host(t) for t in inputs):
                self.counts[func.name().split("::")[-1].split(".")[0]] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        tensor, mode = torch.Tensor, self
        self._saved = {name: (getattr(tensor, name), name in vars(tensor)) for name in ("cpu", "to", "tolist", "numpy")}
        cpu, to, tolist, numpy = (self._saved[n][0] for n in ("cpu", "to", "tolist", "numpy"))

        def patched_to(self, *args, **kwargs):
            out = to(self, *args, **kwargs)
            return mode._host_copy(self, out, "to(cpu)") if names_the_host(args, kwargs) else out

        def reader(read, how):
            def patched(self, *args, **kwargs):
                if not mode._on_host(self):
                    mode.counts[how] += 1
                return read(self, *args, **kwargs)
            return patched

        tensor.cpu = lambda self, *a, **k: mode._host_copy(self, cpu(self, *a, **k), "cpu()")
        tensor.to = patched_to
        tensor.tolist, tensor.numpy = reader(tolist, "tolist()"), reader(numpy, "numpy()")
        return super().__enter__()

    def __exit__(self, *exc):
        for name, (method, own) in self._saved.items():
            if own:
                setattr(torch.Tensor, name, method)
            else:  # inherited from the C base class: take our patch away
                delattr(torch.Tensor, name)
        return super().__exit__(*exc)


@contextmanager
def host_syncs() -> Iterator[Callable[[], int]]:
    """`HostSyncs` as a counter for `syncs_per_step`: yields a function giving the count so far."""
    with HostSyncs() as syncs:
        yield lambda: syncs.total


def syncs_per_step(model: torch.nn.Module, optimizer: Any, batches: Any, loss_of: Callable[[Any], torch.Tensor],
                   monitor: Any = None, counter: Callable[[], Any] = host_syncs) -> list[int]:
    """The host syncs of each step of a training loop over `batches` (forward and loss
    `loss_of(batch)`, backward, step, the loss read as a float, then `monitor.log` when a Monitor
    is given), each step counted inside `counter()`, and last those of closing the Monitor."""
    counts = []
    for step, batch in enumerate(batches):
        with counter() as count:
            loss = loss_of(batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            value = loss.item()
            if monitor is not None:
                monitor.log(step, train_loss=value)
        counts.append(count())
    with counter() as count:
        if monitor is not None:
            monitor.close()
    return counts + [count()]
