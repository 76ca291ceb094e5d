"""Issue 37's audit of the doctor's trainer_state.json reader, now streamed (probes.doctor.json_stream):
its records equal those of the whole file parsed by the standard library's json (the corpus's real
Trainer states, and damaged ones: the same error positions); string losses, booleans, integers
beyond Python's 4300 digits, steps that are no step, and files that are no JSON object, each one
line naming the file or one warning."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from probes.doctor.json_stream import JsonStreamError, read_object_streaming
from probes.doctor.run_history import RunHistory
from test_doctor_logs import cli, one_error_line, write

CORPUS = Path(__file__).resolve().parent / "data" / "doctor_logs"
KEYS = {"loss": "train_loss", "eval_loss": "val_loss", "learning_rate": "lr", "grad_norm": "grad_norm",
        "num_input_tokens_seen": "tokens"}


def reference_records(path: Path) -> list[dict]:
    """The records as the whole file parsed at once gives them (the reader before streaming)."""
    merged: dict[int, dict] = {}
    for e in json.loads(path.read_text())["log_history"]:
        if isinstance(e.get("step"), int):
            values = {ours: float(e[k]) for k, ours in KEYS.items()
                      if isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool)}
            if values:
                merged.setdefault(e["step"], {"step": e["step"]}).update(values)
    return [merged[s] for s in sorted(merged)]


def same(a: list[dict], b: list[dict]) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN == NaN as text


@pytest.mark.parametrize("state", sorted(CORPUS.glob("*/trainer_state.json")) + sorted(CORPUS.glob("*/*/trainer_state.json")),
                         ids=lambda p: p.parent.name)
def test_streamed_records_equal_the_whole_file_parsed_on_the_corpus(state):
    assert same(RunHistory.read(None, log=state).records, reference_records(state))


def test_streaming_reads_across_window_edges(tmp_path, monkeypatch):
    """A window of 7 characters: every value, number and key is cut somewhere, and read whole."""
    from probes.doctor import json_stream
    monkeypatch.setattr(json_stream, "CHUNK", 7)
    history = [{"loss": 2.5 - s / 1000, "step": s, "learning_rate": 1e-4, "grad_norm": 123456.789} for s in range(1, 60)]
    path = write(tmp_path / "trainer_state.json", json.dumps({"global_step": 59, "log_history": history,
                                                               "max_steps": 1234567, "note": "x" * 50}, indent=2))
    seen = []
    top = read_object_streaming(path, "log_history", seen.append)
    assert seen == history and top == {"global_step": 59, "log_history": True, "max_steps": 1234567, "note": "x" * 50}


@pytest.mark.parametrize("text", [
    '{"log_history": [{"loss": 2.0, "step": 5}',  # cut mid-write
    '{"log_history": [{"loss": 2.0, "step": 5},\n  {"loss": 2.',
    '{"log_history": [{"loss": 2.0 "step": 5}]}',
    '{\n"a": 1,\n\n  "log_history": [1, 2,, 3]}',
    '{"log_history": []} trailing',
    '{"log_history": [], }',
    '{log_history: []}',
    '',
])
def test_damaged_json_is_placed_where_json_places_it(tmp_path, text):
    path = write(tmp_path / "trainer_state.json", text)
    with pytest.raises(json.JSONDecodeError) as reference:
        json.loads(text)
    with pytest.raises(JsonStreamError) as streamed:
        read_object_streaming(path, "log_history", lambda e: None)
    where = f"line {reference.value.lineno}, column {reference.value.colno}"
    assert where in str(streamed.value), (str(streamed.value), where)


@pytest.mark.parametrize("content, problem", [
    ('[{"loss": 2.0, "step": 5}]', "not valid JSON (not a JSON object (a list))"),
    ('"log_history"', "not a JSON object (a str)"),
    ('{"log_history": {"loss": 2.0}}', "no log_history list"),
    ('{"log_history": [1, 2, 3]}', "no loss among its log_history keys"),
    ('{"log_history": [{"loss": "2.5", "step": 5}, {"loss": "2.4", "step": 10}]}',
     "its 'loss' values are not numbers ('2.5', a str): nothing to diagnose"),
    ('{"log_history": [{"loss": true, "step": 5}]}', "its 'loss' values are not numbers (True, a bool)"),
    ('{"log_history": [{"loss": 2.0, "step": ' + "9" * 5000 + '}]}', "no loss among its log_history keys"),
    ("", "not valid JSON (Expecting value: the file is empty at line 1, column 1)"),
])
def test_a_trainer_state_that_cannot_be_diagnosed_is_one_line(tmp_path, capsys, content, problem):
    write(tmp_path / "trainer_state.json", content)
    code, out, err = cli(capsys, "--ckpt", str(tmp_path))
    line = one_error_line(err)  # before: 'no loss among its keys (it has: ..., loss)'; 'Exceeds the limit (4300 digits)'
    assert code == 2 and out == "" and problem in line and "trainer_state.json" in line and "4300" not in line


def entries(n: int, loss=lambda s: 3.0 - s / 100) -> list[dict]:
    return [{"epoch": s / 10, "grad_norm": 1.0, "learning_rate": 1e-3, "loss": loss(s), "step": s} for s in range(1, n + 1)]


def test_some_string_losses_are_left_out_with_one_warning(tmp_path, caplog):
    history = entries(20)
    history[4]["loss"] = "nan?"
    path = write(tmp_path / "trainer_state.json", json.dumps({"log_history": history}))
    with caplog.at_level(logging.WARNING):
        h = RunHistory.read(None, log=path)
    at = {r["step"]: r for r in h.records}
    assert "train_loss" not in at[5] and at[6]["train_loss"] == 3.0 - 6 / 100 and len(h.records) == 20
    assert "1 'loss' value not a number ('nan?', a str), left out" in caplog.text


def test_huge_numbers_read_without_pythons_digit_limit(tmp_path, caplog):
    history = entries(20)
    history.append({"loss": 1.0, "step": 10 ** 30})  # a whole number: a step, however large
    text = json.dumps({"log_history": history, "max_steps": 10 ** 30})
    text = text.replace('"step": 3}', '"step": ' + "7" * 5000 + "}")  # no step: left out, said
    with caplog.at_level(logging.WARNING):
        h = RunHistory.read(None, log=write(tmp_path / "trainer_state.json", text))
    steps = [r["step"] for r in h.records]
    assert 3 not in steps and steps[-1] == 10 ** 30 and len(steps) == 20
    assert "skipped 1 log_history entry without a whole-number step" in caplog.text


def test_json_nan_and_infinity_are_read_as_pythons_json_reads_them(tmp_path):
    text = '{"log_history": [{"loss": 2.0, "step": 1}, {"loss": NaN, "step": 2}, {"grad_norm": Infinity, "loss": 1.0, "step": 3}]}'
    h = RunHistory.read(None, log=write(tmp_path / "trainer_state.json", text))
    assert same(h.records, reference_records(tmp_path / "trainer_state.json")) and h.records[2]["grad_norm"] == float("inf")


def test_a_utf16_trainer_state_is_read(tmp_path):
    text = json.dumps({"log_history": entries(10)}, indent=2)
    path = tmp_path / "trainer_state.json"
    path.write_bytes(b"\xff\xfe" + text.encode("utf-16-le"))
    assert same(RunHistory.read(None, log=path).records, reference_records(write(tmp_path / "u8" / "trainer_state.json", text)))


def test_a_binary_trainer_state_is_one_line(tmp_path, capsys):
    (tmp_path / "trainer_state.json").write_bytes(bytes(range(256)))
    code, _, err = cli(capsys, "--ckpt", str(tmp_path))
    assert code == 2 and "trainer_state.json: a binary file" in one_error_line(err) and "\\x" not in err


def test_entries_out_of_step_order_merge_as_the_whole_file_did(tmp_path):
    history = entries(12)
    history = history[6:] + history[:6] + [{"eval_loss": 2.5, "step": 3}, {"loss": 9.0, "step": 8}]
    path = write(tmp_path / "trainer_state.json", json.dumps({"log_history": history}))
    records = RunHistory.read(None, log=path).records
    assert same(records, reference_records(path))
    assert [r["step"] for r in records] == list(range(1, 13)) and records[7]["train_loss"] == 9.0
