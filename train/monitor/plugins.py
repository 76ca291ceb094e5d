"""How a plugin (the guard: `train.guard.monitor`) works inside the Monitor, both ways as protocols:
`Plugin`, what the Monitor calls of it, and `Watched`, what it may read and call of the Monitor.
The Monitor names no plugin's insides and a plugin never imports the Monitor: each types the other
against these (so the guard and the Monitor import no circle). Torch-free: types only."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

__all__ = ["Plugin", "Watched"]


class Watched(Protocol):
    """The Monitor as a plugin sees it: its model and optimizer, the step being counted, the record
    being made (`_pending`, a plugin may add its own entry), what the optimizer's step measured
    (`_captures`), and the calls a plugin makes to write a record, save or close."""

    model: Any
    optimizer: Any
    out_dir: Path
    config: Any  # our ModelConfig of the model, None for a model the store cannot rebuild
    tapped_model: dict[str, Any] | None
    any_saver: Any
    eval_tokens: Any
    trainer: str
    guard: Any  # what the plugin leaves on the Monitor for the user (the guard at work: its rescues)
    first_nonfinite_step: int | None
    _next_step: int
    _steps_since_log: int
    _step_lr: float | None
    _pending: dict[str, Any] | None
    _captures: dict[int, dict[str, Any]]
    _eval: Any

    def due(self, step: int) -> bool: ...

    def attention_at(self, step: int) -> dict[str, list[float]]: ...

    def record(self, step: int, **scalars: Any) -> None: ...

    def flush(self) -> dict[str, Any] | None: ...

    def save(self, step: int) -> Path | None: ...

    def close(self, report: bool | None = None) -> Any: ...


class Plugin(Protocol):
    """What the Monitor calls of a plugin: when it opens the run, at each `log` and at `check`."""

    def describe(self) -> dict[str, Any]:
        """Entries for run.json (written when the run opens, before any hook)."""

    def hook(self, monitor: Watched) -> list[Any]:
        """Hook what it needs (on the optimizer) before the Monitor hooks its own: the handles,
        removed when the Monitor closes."""

    def at_log(self, monitor: Watched, step: int, scalars: dict[str, Any]) -> bool:
        """`Monitor.log(step, **scalars)` before the Monitor's own work: True when the plugin made
        the step's record itself (the Monitor then does nothing more)."""

    def at_check(self, monitor: Watched, step: int, loss: Any) -> bool:
        """`Monitor.check(loss, step)` before the optimizer's step: False refuses the update."""
