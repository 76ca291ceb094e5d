"""Issue 60's audit of the development probe's caches (probes.development_parts.cache) and inputs: a cached
reading of the wrong shape is recomputed (logged), never trusted, never a crash; weights replaced or
cut short under a config.json that stayed are read again (and refused by the load's own check), a
snapshot copied to another step reports that step; `--data` on a FIFO, snapshots of different
vocabularies and an unreadable weights file are one line naming the file."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil

import pytest
import torch
from close import differences
from development_kit import hand_set, save_run

from probes import development
from probes.errors import ProbeInputError
from train.repetition import attention_only

TOKENS = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])
STALE = "step_000010"


@pytest.fixture
def hand_run(tmp_path):
    """Two snapshots of the hand-set heads, read once: each with its development.json."""
    run = save_run(tmp_path / "run", [(0, hand_set(0.0)), (10, hand_set(40.0))])
    return run, development.run(run, tokens=TOKENS).snapshots


def deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


def replace_reading(reading: dict, case: str):
    if case == "a list":
        return [reading]
    if case == "a string":
        return "reading"
    if case == "no scores":
        return {k: v for k, v in reading.items() if k != "scores"}
    if case == "a string step":
        return {**reading, "step": "10"}
    if case == "another model's shape":  # consistent in itself: 3 layers of 2 heads
        grid = [[0.5, 0.5]] * 3
        return {**reading, "entropy": grid, "scores": {k: grid for k in reading["scores"]}}
    if case == "a ragged grid":
        return {**reading, "entropy": [[0.5], [0.5, 0.5]]}
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["nested 100k deep", "a list", "a string", "no scores", "a string step",
                                  "another model's shape", "a ragged grid"])
def test_a_cached_reading_of_the_wrong_shape_is_recomputed(hand_run, case, caplog):
    run, first = hand_run
    cache = run / STALE / "development.json"
    saved = json.loads(cache.read_text())
    if case == "nested 100k deep":
        cache.write_text(cache.read_text().replace('"reading":{', f'"reading":{{"deep":{deep()},', 1))
    else:
        cache.write_text(json.dumps({**saved, "reading": replace_reading(saved["reading"], case)}))
    with caplog.at_level(logging.WARNING, logger="probes.development"):
        again = development.run(run, tokens=TOKENS).snapshots
    said = [r.getMessage() for r in caplog.records if "recomputed" in r.getMessage()]
    if case == "another model's shape":  # a whole reading, of other layers and heads: which one is stale
        assert [s["from"] for s in again] == ["computed", "computed"] and "different layers or heads" in said[0]
    else:
        assert [s["from"] for s in again] == ["cache", "computed"] and STALE in said[0]
    for before, after in zip(first, again):
        assert not differences({k: v for k, v in after.items() if k != "from"},
                               {k: v for k, v in before.items() if k != "from"})


def test_stale_caches_are_never_served(hand_run, capsys):
    run, first = hand_run
    shutil.copytree(run / STALE, run / "step_000500")  # a snapshot copied to another step, its cache too
    copied = development.run(run, tokens=TOKENS).snapshots
    assert [(s["step"], s["snapshot"], s["from"]) for s in copied] == [
        (0, "step_000000", "cache"), (10, STALE, "cache"), (500, "step_000500", "cache")]
    weights = run / "step_000500" / "model.safetensors"
    shutil.copy(run / "step_000000" / "model.safetensors", weights)  # replaced; config.json stayed
    assert development.main(["--ckpt", str(run), "--json"]) == 2
    assert "step_000500/model.safetensors: sha256 mismatch" in capsys.readouterr().err
    data = (run / STALE / "model.safetensors").read_bytes()
    weights.write_bytes(data[:len(data) // 2])  # cut short
    assert development.main(["--ckpt", str(run)]) == 2
    assert "step_000500/model.safetensors: truncated or corrupt" in capsys.readouterr().err


def test_inputs_and_files_that_cannot_be_read_are_one_line_naming_them(hand_run, tmp_path, capsys, no_hang,
                                                                         monkeypatch):
    run, _ = hand_run
    os.mkfifo(tmp_path / "text.fifo")
    assert development.main(["--ckpt", str(run), "--data", str(tmp_path / "text.fifo")]) == 2
    assert "text.fifo: a FIFO (named pipe), not a regular file" in capsys.readouterr().err
    # snapshot 0 of a vocabulary of 16, the latest of 32: the text made for the latest holds ids past 16
    wider = save_run(tmp_path / "wider", [(0, hand_set(40.0))])
    cfg = hand_set(0.0).cfg
    save_run(wider, [(10, attention_only(dataclasses.replace(cfg, d_vocab=2 * cfg.d_vocab)))])
    with pytest.raises(ProbeInputError, match=r"wider/step_000000: a vocabulary of 16 tokens, but the run's "
                                              r"text .* holds token id (1[6-9]|2\d|3[01]): the run's snapshots "
                                              r"have different vocabularies"):
        development.run(wider, cache=False)
    import models.store.snapshot as snapshot

    def no_permission(path, *args, **kwargs):  # run as root, a chmod 000 file is still readable: simulated
        if str(path).endswith("model.safetensors"):
            raise PermissionError(13, "Permission denied", str(path))
        return open(path, *args, **kwargs)
    monkeypatch.setattr(snapshot, "open", no_permission, raising=False)
    assert development.main(["--ckpt", str(run), "--no-cache"]) == 2
    assert "model.safetensors: cannot read it (permission denied)" in capsys.readouterr().err
