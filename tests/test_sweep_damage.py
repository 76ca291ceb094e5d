"""A damaged sweep.json (by hand, by another tool, by a merge) gives one line naming the file and the
field, exit 2, in each of its readers: `python -m probes.sweep`, `python -m train.sweep --resume`
and the app's Sweep page; never a KeyError, a TypeError or "Unknown format code 'e' for object of
type 'str'". Each damage starts from the shipped sweep's own sweep.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from app_kit import open_app
from probes import sweep as probe_sweep
from probes.sweep_parts.file import SweepFileError, check_sweep
from train.sweep.cli import main as sweep_main

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "sweep_qk_norm" / "sweep.json"


def shipped() -> dict:
    return json.loads(SHIPPED.read_text())


def drop(*keys):
    def damage(d):
        target = d
        for k in keys[:-1]:
            target = target[k]
        del target[keys[-1]]
    return damage


def put(value, *keys):
    def damage(d):
        target = d
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value
    return damage


# (id, damage, the field the one line must name)
CASES = [
    ("no preset", drop("grid", "preset"), "grid.preset"),
    ("no run status", drop("runs", 2, "status"), "runs[2].status"),
    ("no run name", drop("runs", 0, "name"), "runs[0].name"),
    ("no run dir", drop("runs", 5, "dir"), "runs[5].dir"),
    ("rates as strings", put(["1e-3", "1e-2"], "grid", "rates"), "grid.rates"),
    ("empty rates", put([], "grid", "rates"), "grid.rates"),
    ("lr as a string", put("1e-2", "runs", 1, "lr"), "runs[1].lr"),
    ("runs as a mapping", put({"a": 1}, "runs"), "runs"),
    ("grid as a list", put([1, 2], "grid"), "grid"),
    ("a run as a list", put(["x"], "runs", 3), "runs[3]"),
    ("final loss as a string", put("2.31", "runs", 0, "final_val_loss"), "runs[0].final_val_loss"),
    ("exit code as a string", put("2", "runs", 0, "exit_code"), "runs[0].exit_code"),
    ("an unknown status", put("exploded", "runs", 4, "status"), "runs[4].status"),
    ("a dir out of the sweep", put("../../elsewhere", "runs", 0, "dir"), "runs[0].dir"),
    ("a dir given twice", put("lr=1e-03,qk_norm=rms", "runs", 0, "dir"), "runs[1].dir"),
    ("vary as a list", put(["qk_norm"], "grid", "vary"), "grid.vary"),
    ("sensitivity as a string", put("1.15", "variants", 0, "lr_sensitivity"), "variants[0].lr_sensitivity"),
    ("stable range with a string end", put("0.1", "variants", 1, "stable_range", "hi"),
     "variants[1].stable_range.hi"),
    ("findings as a string", put("divergence", "runs", 6, "findings"), "runs[6].findings"),
    ("a sweep status nobody writes", put(7, "status"), "status"),
    ("last step as a float", put(12.5, "runs", 0, "last_step"), "runs[0].last_step"),
]


def damaged(tmp_path: Path, damage) -> Path:
    data = shipped()
    damage(data)
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "sweep.json").write_text(json.dumps(data))
    return folder


def test_the_shipped_sweep_and_its_copy_pass_the_check():
    data = shipped()
    assert check_sweep(copy.deepcopy(data), SHIPPED) == data


@pytest.mark.parametrize("damage,field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_probes_sweep_names_the_file_and_the_field(damage, field, tmp_path, capsys):
    folder = damaged(tmp_path, damage)
    assert probe_sweep.main(["--ckpt", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(folder / "sweep.json") in err and f"{field}" in err, err
    assert "Traceback" not in err and "KeyError" not in err


@pytest.mark.parametrize("damage,field", [c[1:] for c in CASES[:8]], ids=[c[0] for c in CASES[:8]])
def test_a_resume_of_a_damaged_sweep_is_refused_before_anything_changes(damage, field, tmp_path, capsys):
    folder = damaged(tmp_path, damage)
    before = (folder / "sweep.json").read_bytes()
    assert sweep_main(["--out", str(folder), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and field in err and len(err.splitlines()) == 1, err
    assert (folder / "sweep.json").read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["sweep.json"]


def test_a_damaged_file_is_a_sweep_file_error_not_a_key_error(tmp_path):
    with pytest.raises(SweepFileError, match=r"grid\.preset is missing"):
        check_sweep({"grid": {"data": "x", "rates": [0.1]}, "runs": []}, tmp_path / "sweep.json")
    with pytest.raises(SweepFileError, match="not a mapping"):
        check_sweep([1, 2], tmp_path / "sweep.json")


@pytest.mark.parametrize("case", [CASES[0], CASES[10], CASES[7]], ids=[CASES[0][0], CASES[10][0], CASES[7][0]])
def test_the_sweep_page_says_what_is_damaged_in_the_page(case, tmp_path, monkeypatch):
    _, damage, field = case
    folder = damaged(tmp_path, damage)
    at = open_app(monkeypatch, roots=[tmp_path], page="sweep")
    errors = [e.value for e in at.error]
    assert any(field in e and "sweep.json" in e for e in errors), errors
    assert not any("unexpected" in e for e in errors), errors

