"""What kind of trouble the guard sees (`train.guard`), from numbers on the host: pure functions.

- `data_spike`: a few batches (`patience` or more) far above the level, over within `hold` steps
  and at once (the loss after them drops a third of the way back to the level or more in one step
  and stays below them: the model is fine on the next batch, its damage aside), the run
  otherwise calm (no growth signal, no third spike within `window` steps, each after calm): skip them.
- `rate_blowup`: a non-finite loss, spikes that repeat, a growth signal (update ratios above
  their band, the gradient norm grown, the doctor's warning from the internals), spikes before
  the run has a level (a nat above the untrained model's loss: its first steps), losses over four
  times the untrained model's, or a loss that stays high for `hold` steps without falling, above
  the untrained model's: rewind and lower the rate.
- `data_shift`: a loss that comes down from its jump under the spike line by itself, or stays at a
  new level for `hold` steps and falls there (or stays flat, with nothing growing, below the
  untrained model's loss): data the model learns from; a spike again right after a skip, until
  `hold` bad batches in all, too.
- `stall`: after a rescue, a loss flat far above the level before the trouble (`stalled`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

__all__ = ["Excursion", "RATIO_LINE", "U_TOP", "bad_block", "classify", "falling", "growth", "own_noise", "rate_rose", "ratios_say",
           "stalled"]

U_TOP = 1e-2  # the top of the healthy band of update ratios (rms(du)/rms(w)) for SGD and Adam steps


@dataclass(frozen=True)
class Excursion:
    """A run of spikes and what surrounds it, as the classifier reads it."""

    losses: tuple[float, ...]  # the spikes in a row, oldest first
    closed: bool  # the loss came back under the spike line after them
    level: float  # the level before them
    noise: float  # one step's noise before them
    first: float | None  # the untrained model's loss
    growth: str | None = None  # a growth signal seen in or just before them, in words
    recent_skips: int = 0  # data spikes skipped within `window` steps before, each after calm
    early: bool = False  # before the run has a level (its first steps, or since a rewind): spikes are the rate's
    after: float | None = None  # the loss that came back (closed): bad batches end at once, a shift comes down


def falling(losses: tuple[float, ...] | list[float], noise: float) -> bool:
    """Whether a loss run falls: its last quarter's mean is clearly below its first quarter's."""
    n = len(losses)
    if n < 4:
        return False
    quarter = max(1, n // 4)
    head, tail = statistics.fmean(losses[:quarter]), statistics.fmean(losses[-quarter:])
    return head - tail > max(3 * noise / math.sqrt(quarter), 0.02 * abs(head))


def own_noise(losses: list[float]) -> float:
    """The standard deviation of one step's loss from these losses' own consecutive differences."""
    diffs = [(b - a) ** 2 for a, b in zip(losses, losses[1:])]
    return math.sqrt(math.fsum(diffs) / (2 * len(diffs))) if diffs else 0.0


def classify(ex: Excursion, patience: int, hold: int) -> tuple[str, str] | None:
    """(kind, why in one sentence) of an excursion, or None: not trouble (yet)."""
    n, top = len(ex.losses), max(ex.losses)
    if not all(math.isfinite(v) for v in ex.losses):
        return "rate_blowup", f"the loss is {next(v for v in ex.losses if not math.isfinite(v))}"
    rise = f"{n} loss(es) up to {top:.3f} against a level of {ex.level:.3f}"
    if ex.growth is not None:
        return "rate_blowup", f"{rise}, and {ex.growth}"
    if ex.early and n >= patience:
        return "rate_blowup", f"{rise}, a nat above the untrained model's {ex.first:.3f} before the run has a level"
    if n >= patience and ex.first is not None and ex.first > 0 and top > 4 * ex.first:
        return "rate_blowup", f"{rise}, over four times the untrained model's {ex.first:.3f}: broken weights"
    worse = bad_block(ex.losses, ex.level, patience)
    if not ex.closed and worse:
        if ex.recent_skips >= 2:
            return "rate_blowup", f"{rise}: spikes repeat ({ex.recent_skips} skipped within the window before)"
        return "data_spike", (f"{worse} batch(es) up to {max(ex.losses[:worse]):.3f} against a level of "
                              f"{ex.level:.3f}, then the loss down at once to {ex.losses[worse]:.3f}: bad batches, "
                              "the run otherwise calm")
    if ex.closed:
        if n < patience:
            return None  # one that passes by itself
        last = ex.losses[-1]
        if ex.after is not None and last - ex.after < 0.5 * (last - ex.level):
            return "data_shift", (f"{rise}, coming down by itself to {ex.after:.3f} under the spike line: data the "
                                  "model learns, or a blip it recovers from")
        if ex.recent_skips >= 2:
            return "rate_blowup", f"{rise}: spikes repeat ({ex.recent_skips} skipped within the window before)"
        return "data_spike", f"{rise}, then back to the level: a few bad batches, the run otherwise calm"
    if n < hold:
        return None  # wait: a few bad batches end, a shift or a blow-up stays
    if falling(ex.losses, ex.noise):
        return "data_shift", f"{rise} for {n} steps, falling: a new level the model learns from"
    if ex.first is not None and top > ex.first + 0.5:
        return "rate_blowup", f"{rise} for {n} steps, not falling, above the untrained model's {ex.first:.3f}"
    return "data_shift", f"{rise} for {n} steps, flat with nothing growing: a new level, not a blow-up"


RATIO_LINE = 3e-2  # an update ratio above this (three times the healthy band's top, 1e-2) can be growth


def growth(ratios, norms, began: int, read_every: int) -> str | None:
    """A growth signal in words, or None: an update ratio above the band (3e-2) and three times its
    calm median (3e-2 alone where none was measured calm), or a gradient norm ten times its calm
    median, in the measurements of the two `read_every` spans before the trouble began or in the last two since (both: a bad batch's own
    update is large by its data); a non-finite gradient norm at once. `ratios`: (step, ratio, rate,
    calm); `norms`: (step, norm, calm)."""
    before, since = began - 2 * read_every, began
    calm_u = [u for _, u, _, calm in ratios if calm]
    calm_g = [g for _, g, calm in norms if calm]
    u_line, g_line = lines(calm_u, calm_g)
    for name, values, line, calm in (("update ratio", [(s, u) for s, u, _, _ in ratios], u_line, calm_u),
                                     ("gradient norm", [(s, g) for s, g, _ in norms], g_line, calm_g)):
        if name == "gradient norm" and any(not math.isfinite(v) for s, v in values if s >= before):
            return "the gradient norm is not finite"
        grown = [(s, v) for s, v in values if before <= s < since and v > line]
        after = [(s, v) for s, v in values if s >= since]
        if not grown and len(after) >= 2 and all(v > line for _, v in after[-2:]):
            grown = after[-1:]
        if grown:
            s, v = grown[-1]
            times = f"{v / statistics.median(calm):.0f}x its calm median" if calm else f"above {line:g}"
            return f"the {name} rose to {v:.3g} at step {s} ({times})"
    return None


def lines(calm_u: list[float], calm_g: list[float]) -> tuple[float, float]:
    """(the update ratio's growth line, the gradient norm's) from their calm measurements."""
    u_line = max(RATIO_LINE, 3 * statistics.median(calm_u)) if calm_u else RATIO_LINE  # none calm: the line alone
    return u_line, 10 * statistics.median(calm_g) if calm_g else math.inf


def rate_rose(rates: list[tuple[int, float]], began: int, span: int) -> str | None:
    """The rate the updates applied rose three-fold or more as the trouble began (over the last two
    steps before it and since) against the `span` steps before, in words; else None. A loss that
    jumps to a new level and falls there is a data shift, unless the rate itself jumped: Adam's
    update ratios say little after the first spike (its second moment takes in the spike's large
    gradients), the rate says it plainly (a warmup rises three-fold within `span` steps only in its
    first steps, where the run has no level yet)."""
    before = [r for s, r in rates if began - span <= s < began - 2]
    at = [(s, r) for s, r in rates if s >= began - 2]
    if not before or not at or max(before) <= 0:
        return None
    s, top = max(at, key=lambda x: x[1])
    if top < 3 * max(before):
        return None
    return f"the rate applied rose from {max(before):.3g} to {top:.3g} at step {s}, as the trouble began"


def ratios_say(ratios, began: int) -> bool:
    """Whether the update ratios measured since the trouble began can tell the rate from the data:
    two or more (growth wants two: a bad batch's own update is large by its data), or one under the
    growth line. A blow-up that starts off a log step is decided on its hold before its second (a
    rate x30 from step 253, ratios at 260 and 270, decided at 269): the guard measures the next
    update's itself (`update_probe`) until they can."""
    calm_u = [u for _, u, _, calm in ratios if calm]
    since = [u for s, u, *_ in ratios if s >= began]
    return len(since) >= 2 or len(since) == 1 and since[0] <= lines(calm_u, [])[0]


def bad_block(losses: tuple[float, ...], level: float, patience: int = 1) -> int:
    """How many of the first losses (`patience` or more) are bad batches: the loss after them drops
    at once, a third of the way back to `level` or more in one step, and every loss after lies below
    every one of them (random tokens, shuffled labels: the model is fine on the next good batch, its
    damage aside; a shift the model learns comes down gradually). 0 when there is no such block."""
    for k in range(max(1, patience), len(losses)):
        head, tail = losses[:k], losses[k:]
        if losses[k - 1] - losses[k] >= 0.3 * (losses[k - 1] - level) and max(tail) < min(head):
            return k
    return 0


def stalled(losses: list[float], target: float, gap: float, noise: float) -> bool:
    """After a rescue: the loss flat (not falling over the second half) and `gap` nats or more above
    `target` (the level before the trouble)."""
    if len(losses) < 8:
        return False
    recent = statistics.fmean(losses[-max(1, len(losses) // 4):])
    return recent > target + gap and not falling(losses[len(losses) // 2:], noise)
