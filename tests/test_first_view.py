"""The first view saved beside a snapshot (`probes.first_view`, `models.store.view_file`): packed and
read back equal, its numbers the probes' on the model, written by our trainer and the Monitor with
each snapshot, and never read when it belongs to other weights or is damaged (the pages then read
the model)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from close import agree, differences
from nanogpt_ref import GPT, GPTConfig

from models.checkpoint import list_snapshots, load_checkpoint
from models.store.files import CheckpointError
from models.store.view_file import VIEW_FILE, VIEW_VERSION, read_view, write_view
from models.tokenizers import CharTokenizer
from probes import page_view
from probes.first_view import PAGE_TEXT, pack, page_ids, unpack
from train.loop import main as train_main
from train.monitor import Monitor

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints"
TEXT = ("the king and the queen shall not be what thou art.\n" * 40) + PAGE_TEXT + "\n"


def same(a, b) -> bool:
    """Equal, NaN equal to NaN, and of the same Python type (a float stays a float, None stays None)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def read_back(directory, tokenizer):
    arrays, info = read_view(directory, json.loads((directory / "config.json").read_text())["tensors_sha256"])
    return unpack(arrays, info["parts"], tokenizer), info


PARTS = {  # each kind of value a part holds, with the dtype its numbers must be kept in
    "attention": {"verdicts": [["healthy", "sink"]], "rows": 3, "tokens": [5, 1, 2],
                  "evidence": {"entropy": [[0.5, float("nan")]], "nonfinite_rows": [[0, 300]],
                               "weights_finite": [[True, None]], "max_prob": [[1 / 3, 0.25]]}},
    "lens": {"layers": ["embed", "0_post"], "pieces": [["a", "b"]], "kl_to_final": [0.125, None],
             "target_rank_per_position": [[[2.0, None]], [[None, None]]],
             "top_k": [[[[{"id": 1, "piece": "b", "prob": 0.75}, {"id": 0, "piece": "a", "prob": 0.25}], []]],
                       [[[], []]]]},
    "map/input": {"x": [1.5, -2.0], "y": [0.1, 0.2], "explained": [0.5, 0.25], "pieces": ["a", "b"]},
    "nearest/input": {"query": {"id": 0, "piece": "a"}, "neighbours": [{"id": 1, "piece": "b", "cosine": 0.3}],
                      "mean_cosine": 0.3},
}


def test_parts_pack_into_the_smallest_exact_arrays_and_read_back_equal():
    tokenizer = CharTokenizer(["a", "b"])
    arrays, skeleton = pack(PARTS)
    assert same(unpack(arrays, skeleton, tokenizer), PARTS)
    json.dumps(skeleton)  # the rest is JSON
    kinds = {name: a.dtype for name, a in arrays.items()}
    # 1/3 needs float64; 0.5, 0.25, 0.75...: float32; ranks 2.0 and ids, counts 300: integers, the first fits int8
    assert kinds == {"float64": np.float64, "float32": np.float32, "int8": np.int8, "int16": np.int16,
                     "uint8": np.uint8}
    assert arrays["float64"].tolist() == [1 / 3, 0.25, 0.1, 0.2]  # a grid is kept in one dtype
    assert "piece" not in json.dumps(skeleton["lens"]["top_k"]) and "pieces" not in skeleton["map/input"]


def test_the_view_file_is_checked_against_the_weights_and_read_whole_or_refused(tmp_path, caplog):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"the weights")
    digest = hashlib.sha256(b"the weights").hexdigest()
    write_view(tmp_path, {"float32": np.arange(3, dtype=np.float32)}, {"weights_sha256": digest, "parts": {}})
    arrays, info = read_view(tmp_path, digest)
    assert arrays["float32"].tolist() == [0.0, 1.0, 2.0] and info["format_version"] == VIEW_VERSION
    assert read_view(tmp_path, "def") is None  # read from other weights: stale, not used
    assert read_view(tmp_path / "elsewhere", digest) is None  # none saved
    weights.write_bytes(b"the weig")  # truncated after the view was saved: the model's loader must say so
    with caplog.at_level("WARNING"):
        assert read_view(tmp_path, digest) is None
    assert "not the weights config.json records" in caplog.text
    weights.write_bytes(b"the weights")
    data = (tmp_path / VIEW_FILE).read_bytes()
    (tmp_path / VIEW_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"{VIEW_FILE}: not a first view") as err:
        read_view(tmp_path, digest)
    assert "\n" not in str(err.value)


def rewritten(path: Path, change) -> None:
    """The view file with its arrays or JSON changed by `change(arrays, meta)`, its recorded hash kept."""
    from safetensors.numpy import load_file, save_file
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = json.loads(f.metadata()["first_view"])
    arrays = load_file(str(path))
    change(arrays, meta)
    save_file(arrays, str(path), metadata={"first_view": json.dumps(meta)})


def moved(grid: list) -> None:  # [dtype, start, shape, kind, mask]: the grid read from one number on
    grid[1] += 1


TAMPERED = {  # a view changed after it was written: each drawn as the model's unless the whole view is hashed
    "a head's verdict": lambda arrays, meta: meta["parts"]["attention"]["verdicts"][0].__setitem__(0, "collapsed"),
    "a grid's offset": lambda arrays, meta: moved(meta["parts"]["attention"]["evidence"]["max_prob"]["@"]),
    "the view's tokens": lambda arrays, meta: meta.__setitem__("tokens", [9, 9, 9]),
    "the skipped parts": lambda arrays, meta: meta.__setitem__("skipped", {"lens": "not read"}),
    "an array": lambda arrays, meta: arrays["float32"].__setitem__(0, arrays["float32"][0] + 1),
    "format version 1": lambda arrays, meta: meta.__setitem__("format_version", 1),
}


@pytest.mark.parametrize("case", TAMPERED)
def test_a_view_changed_after_it_was_written_is_never_drawn(tmp_path, caplog, case):
    (tmp_path / "model.safetensors").write_bytes(b"the weights")
    digest = hashlib.sha256(b"the weights").hexdigest()
    arrays, skeleton = pack(PARTS)
    write_view(tmp_path, arrays, {"weights_sha256": digest, "tokens": [5, 1, 2], "text": "abc", "skipped": {},
                                  "parts": skeleton})
    assert read_view(tmp_path, digest) is not None
    rewritten(tmp_path / VIEW_FILE, lambda a, m: None)  # written again unchanged: still the view
    assert read_view(tmp_path, digest) is not None
    rewritten(tmp_path / VIEW_FILE, TAMPERED[case])
    with caplog.at_level("INFO"):
        assert read_view(tmp_path, digest) is None
    assert "not used" in caplog.text


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step run of our trainer, snapshots at steps 0 and 4 (each with its first view)."""
    root = tmp_path_factory.mktemp("first_view")
    data = root / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    assert train_main(["--data", str(data), "--out", str(root / "run"), "-q", "--preset", "transformer4_rms_small",
                       "--steps", "4", "--batch-size", "8", "--log-every", "2", "--eval-every", "4",
                       "--save-every", "4", "--seed", "0"]) == 0
    return root / "run"


def test_our_trainer_saves_each_snapshots_view_and_it_is_the_probes_on_the_model(trained):
    snapshots = list_snapshots(trained)
    assert [p.name for p in snapshots] == ["step_000000", "step_000004"]
    for path in snapshots:
        snap = load_checkpoint(path)
        parts, info = read_back(path, snap.tokenizer)
        ids = torch.tensor([page_ids(snap.tokenizer, snap.config.n_ctx, PAGE_TEXT)])  # [1 16]: the context
        assert info["tokens"] == ids[0].tolist() and info["text"] == PAGE_TEXT and ids.shape[1] == 16
        expected, skipped = page_view.first_view(snap.model, snap.tokenizer, ids)
        assert info["skipped"] == skipped == {}
        assert agree(parts, expected), (path.name, differences(parts, expected))
    assert {"attention", "head_types", "lens", "map/input", "nearest/cross", "baseline/output"} <= set(parts)


def test_the_monitor_on_nanogpt_saves_its_twins_view_and_a_text_it_cannot_encode_none(tmp_path, caplog):
    tokenizer = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, n_embd=16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, optimizer, tmp_path / "run", save_every=2, report=False, tokenizer=tokenizer) as monitor:
        for step in range(3):
            x = torch.randint(0, tokenizer.vocab_size, (4, 17))  # [batch pos+1]
            loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.log(step, train_loss=loss.item())
    path = list_snapshots(tmp_path / "run")[-1]
    snap = load_checkpoint(path)  # our twin of nanoGPT's GPT, as saved
    parts, info = read_back(path, snap.tokenizer)
    expected, _ = page_view.first_view(snap.model, snap.tokenizer, torch.tensor([info["tokens"]]))
    assert agree(parts, expected) and len(parts["attention"]["verdicts"]) == 2
    narrow = CharTokenizer.from_text("the king")  # no capitals: the sidebar's text does not encode
    shutil.rmtree(tmp_path / "run")
    model = GPT(GPTConfig(block_size=16, vocab_size=narrow.vocab_size, n_layer=1, n_head=2, n_embd=16))
    with Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), tmp_path / "run", report=False,
                 tokenizer=narrow) as monitor:
        with caplog.at_level("INFO"):
            saved = monitor.save(0)
    assert (saved / "model.safetensors").is_file() and not (saved / VIEW_FILE).exists()
    assert any("no first view" in r.getMessage() for r in caplog.records)


def test_each_shipped_runs_view_is_the_probes_on_its_model():
    """Saved on another machine, read here on this one's thread count: equal to the float32 rounding."""
    from train.repetition import page_text

    runs = [p for p in sorted(SHIPPED.iterdir()) if p.is_dir() and list_snapshots(p)]
    assert len(runs) == 9
    for run in runs:
        path = list_snapshots(run)[-1]  # the app opens a run on its latest snapshot
        snap = load_checkpoint(path)
        parts, info = read_back(path, snap.tokenizer)
        # the induction run's alphabet cannot spell Shakespeare: train.repetition saved it on its repeat
        want = page_text(snap.config.n_ctx)[:snap.config.n_ctx] if run.name == "induction" else PAGE_TEXT
        ids, text = page_view.snapshot_ids(snap, want)
        expected, skipped = page_view.first_view(snap.model, snap.tokenizer, ids)
        assert info["tokens"] == ids[0].tolist() and info["text"] == text == want, run.name
        assert info["skipped"] == skipped, path
        assert agree(parts, expected), (f"{path}: rerun python -m probes.page_view", differences(parts, expected))


def test_a_stale_or_damaged_view_is_left_and_the_page_reads_the_model(trained, tmp_path, caplog):
    from app import data

    stale, damaged = tmp_path / "stale", tmp_path / "damaged"
    for copy in (stale, damaged):
        shutil.copytree(trained / "step_000004", copy)
    shutil.copy(trained / "step_000000" / VIEW_FILE, stale / VIEW_FILE)  # read from step 0's weights
    view = damaged / VIEW_FILE
    view.write_bytes(view.read_bytes()[:-40])
    old, _ = read_back(trained / "step_000000", None)
    for path, said in ((stale, "read from other weights"), (damaged, "its first view is not read")):
        snap = load_checkpoint(path)
        expected = page_view.attention(snap.model, page_view.snapshot_ids(snap)[0])
        assert not agree(old["attention"], expected)  # step 0's view would show other numbers
        caplog.clear()
        with caplog.at_level("INFO"):
            assert agree(data.attention(str(path), data.mtime(path), PAGE_TEXT), expected), path.name
        assert said in caplog.text, caplog.text


def test_the_view_answers_only_the_pages_first_calls_and_anything_else_loads_the_model(trained, monkeypatch):
    from app import data

    loaded, load = [], data.load
    monkeypatch.setattr(data, "load", lambda *args: loaded.append(args[2:]) or load(*args))
    path = trained / "step_000004"
    key = (str(path), data.mtime(path))
    data.attention(*key, PAGE_TEXT), data.head_types(*key, PAGE_TEXT), data.lens(*key, PAGE_TEXT, 5)
    data.nearest(*key, "e", 10, "cross"), data.neighbour_baseline(*key, "output", 10), data.embedding_map(*key, "input")
    assert loaded == []  # the page's first calls: the saved view
    calls = [lambda: data.attention(*key, "the king"), lambda: data.lens(*key, PAGE_TEXT, 3),
             lambda: data.nearest(*key, "t", 10, "input"), lambda: data.neighbour_baseline(*key, "input", 5),
             lambda: data.head(*key, PAGE_TEXT, 0, 1)]  # another text, top-k, token, k; a head's pattern
    for n, call in enumerate(calls, 1):
        call()
        assert len(loaded) == n, n


def test_the_same_view_in_another_summation_order_differs_in_its_last_bits_and_agrees_to_the_scale():
    """What another CPU does to a saved view, done here: one thread instead of the default, and the
    MLPs' hidden units in another order (the same function, its sums added in another order). The
    numbers move in their last bits, so a test comparing them with `==` fails on this machine first;
    `agree` (tests/close.py) holds them equal to 1e-5 of their scale, and still tells another model apart."""
    path = list_snapshots(SHIPPED / "shakespeare_gpt")[-1]
    snap = load_checkpoint(path)
    ids, _ = page_view.snapshot_ids(snap)
    saved, _ = read_back(path, snap.tokenizer)
    saved = {k: saved[k] for k in ("attention", "lens")}

    def view(model) -> dict:
        with torch.no_grad():
            return {"attention": page_view.attention(model, ids), "lens": page_view.lens(model, ids, 5, snap.tokenizer)}

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        other_threads = view(snap.model)
    finally:
        torch.set_num_threads(threads)
    state = snap.model.state_dict()
    for l in range(snap.config.n_layers):
        order = torch.randperm(state[f"blocks.{l}.mlp.net.0.bias"].numel(), generator=torch.Generator().manual_seed(l))
        for name, dim in (("net.0.weight", 0), ("net.0.bias", 0), ("net.2.weight", 1)):
            key = f"blocks.{l}.mlp.{name}"
            state[key] = state[key].index_select(dim, order)
    reordered = type(snap.model)(snap.config).eval()
    reordered.load_state_dict(state)
    shuffled = view(reordered)
    if same(shuffled, saved) and same(other_threads, saved):
        pytest.skip("this CPU added both orders to the same bits: nothing here to tell exactness apart")
    for other in (other_threads, shuffled):
        assert agree(other, saved), differences(other, saved)
    assert not same(shuffled, saved)  # the last bits moved
    with torch.no_grad():
        reordered.blocks[0].mlp.net[2].weight.mul_(1.001)  # one weight matrix 0.1% off: another model
    assert not agree(view(reordered), saved)
