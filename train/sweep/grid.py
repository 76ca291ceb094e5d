"""A sweep's grid: learning rates x variants (`--vary FIELD=V1,V2`, their product) on top of one
`python -m train` command line. Torch-free: every check runs before anything is written.

Each grid point is one ordinary run named after what it changes (`lr=3e-04,qk_norm=rms`). A --vary
field is a hyperparameter flag of `python -m train` (`z_loss` -> `--z-loss`, `weight_decay` ->
`--weight-decay`) or a field of the preset's model config (`qk_norm` -> `--set qk_norm=...`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.presets import PRESETS
from train.args import build_parser as train_parser, parse_sets, train_config_flags
from train.hyper import resolve_train_config

__all__ = ["Grid", "Point", "format_rate", "parse_rates", "parse_vary"]

SWEPT = "lr"  # the flag the sweep itself varies


def parse_rates(text: str) -> tuple[float, ...]:
    """'1e-4,3e-4,1e-3' -> the rates, ascending; empty, non-positive, non-finite or repeated
    rates are refused (argparse turns the error into one line and exit 2)."""
    words = [w.strip() for w in text.split(",")]
    if not text.strip() or not all(words):
        raise argparse.ArgumentTypeError(f"{text!r}: expected learning rates separated by commas, "
                                         "e.g. 1e-4,3e-4,1e-3")
    rates = []
    for word in words:
        try:
            rate = float(word)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{word!r} is not a number") from None
        if not (math.isfinite(rate) and rate > 0):
            raise argparse.ArgumentTypeError(f"{word} is not a positive learning rate")
        if rate in rates:
            raise argparse.ArgumentTypeError(f"{word} is given twice ({text})")
        rates.append(rate)
    return tuple(sorted(rates))


def parse_vary(text: str) -> tuple[str, tuple[str, ...]]:
    """'qk_norm=none,rms' -> ('qk_norm', ('none', 'rms'))."""
    field, sep, values = text.partition("=")
    field = field.strip().replace("-", "_")
    words = tuple(v.strip() for v in values.split(","))
    if not sep or not field or not all(words):
        raise argparse.ArgumentTypeError(f"{text!r}: expected FIELD=V1,V2,... e.g. qk_norm=none,rms")
    if len(set(words)) != len(words):
        raise argparse.ArgumentTypeError(f"{text!r}: a value is given twice")
    if any("/" in w or w != w.split()[0] for w in words):
        raise argparse.ArgumentTypeError(f"{text!r}: values name run folders: no '/' or spaces")
    return field, words


def format_rate(rate: float) -> str:
    """The shortest scientific form that reads back as the same float: 3e-04, 1.5e-04, 1e+00."""
    for digits in range(17):
        text = f"{rate:.{digits}e}"
        if float(text) == rate:
            return text
    return repr(rate)


def hyperparameter_actions() -> dict[str, argparse.Action]:
    """`python -m train`'s hyperparameter flags by dest (all but --lr, the swept one)."""
    parser = argparse.ArgumentParser(add_help=False)
    train_config_flags(parser)
    return {a.dest: a for a in parser._actions if a.dest != SWEPT}


@dataclass(frozen=True)
class Point:
    """One grid point: a rate and one value per --vary field; `name` is its run folder."""

    lr: float
    values: tuple[tuple[str, str], ...]

    @property
    def variant(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.values) or "default"

    @property
    def name(self) -> str:
        return ",".join([f"lr={format_rate(self.lr)}", *(f"{k}={v}" for k, v in self.values)])


@dataclass(frozen=True)
class Grid:
    """The rates, the --vary axes and the command line every run shares (--preset, --data and any
    other `python -m train` flag)."""

    preset: str
    data: str
    rates: tuple[float, ...]
    vary: tuple[tuple[str, tuple[str, ...]], ...] = ()
    train_args: tuple[str, ...] = ()

    def points(self) -> list[Point]:
        names = [field for field, _ in self.vary]
        combos = itertools.product(*(values for _, values in self.vary))
        variants = [tuple(zip(names, combo)) for combo in combos]
        return [Point(lr, values) for lr in self.rates for values in variants]

    def variants(self) -> list[Point]:
        """One point per variant (at the first rate): their names and values."""
        return [p for p in self.points() if p.lr == self.rates[0]]

    def argv(self, point: Point) -> list[str]:
        """The point's `python -m train` flags between --data and --out."""
        return ["--preset", self.preset, *self.train_args, "--lr", format_rate(point.lr),
                *(word for field, value in point.values for word in self.flags(field, value))]

    def flags(self, field: str, value: str) -> list[str]:
        action = hyperparameter_actions().get(field)
        if action is None:
            return ["--set", f"{field}={value}"]
        option = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            return [option if value.lower() in ("true", "1", "yes") else "--no-" + option[2:]]
        return [option, value]

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, "data": self.data, "rates": list(self.rates),
                "vary": {field: list(values) for field, values in self.vary},
                "train_args": list(self.train_args)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grid:
        return cls(d["preset"], d["data"], tuple(d["rates"]),
                   tuple((k, tuple(v)) for k, v in d.get("vary", {}).items()), tuple(d.get("train_args", ())))

    def check(self) -> None:
        """ValueError (one line) for a grid that cannot run: unknown preset, missing data, an
        unknown or doubly given --vary field, a value the trainer or the model config refuses."""
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; choose one of: {', '.join(PRESETS)}")
        if not Path(self.data).is_file():
            raise ValueError(f"--data {self.data}: no such file")
        if len(self.vary) != len({f for f, _ in self.vary}):
            raise ValueError("--vary: a field is given twice; give its values once, separated by commas")
        common = train_parser().parse_args([*self.train_args, "--out", "_"])
        for field, _ in self.vary:
            self.check_field(field, common)
        hyper = hyperparameter_actions()
        for point in self.variants():
            try:  # the trainer's own flags and its own checks of their values (--steps 0, z_loss=-1)
                args = train_parser().parse_args([*self.argv(point), "--out", "_"])
                resolve_train_config(args, PRESETS[self.preset].train, {})
            except ValueError as err:  # the trainer's own one line, said of the point
                where = f"--vary {point.variant}" if self.vary else "the run's flags"
                raise ValueError(f"{where}: {err}") from None
            self.check_model(common.set + [f"{f}={v}" for f, v in point.values if f not in hyper])

    def check_field(self, field: str, common: argparse.Namespace) -> None:
        hyper = hyperparameter_actions()
        model = [f.name for f in dataclasses.fields(PRESETS[self.preset].config)]
        if field not in hyper and field not in model:
            raise ValueError(f"--vary {field}: unknown field; known: train flags {', '.join(sorted(hyper))}; "
                             f"model fields of {self.preset}: {', '.join(model)}")
        if (field in hyper and getattr(common, field) is not None) or any(
                s.partition("=")[0] == field for s in common.set):
            raise ValueError(f"--vary {field} is also given as a fixed flag; give it once")

    def check_model(self, sets: list[str]) -> None:
        config = PRESETS[self.preset].config
        config.replace(**parse_sets(config, sets))  # the config's own checks name the bad field
