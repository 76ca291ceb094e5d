"""A snapshot of any model whose files disagree with themselves (issue 50's audit, in our words):
each is one line from the CLI, exit 2, naming the file and the field, never a traceback and never
numbers drawn as if nothing were wrong. The snapshot is a tutorial GPT saved by the Monitor; each
case rewrites one thing (and the hash config.json keeps of it, so only the disagreement is left)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gpt_kit import PerHeadGPT

from models import info
from models.tokenizers import CharTokenizer
from models.tokenizer_base import TokenizerError
from probes import entropy, logit_lens
from train.monitor import Monitor

VOCAB = 40


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = PerHeadGPT(vocab=VOCAB)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(1))
    run = tmp_path_factory.mktemp("audit") / "run"
    with Monitor(model, optimizer, run, log_every=1, eval_every=1, save_every=1, report=False, eval_tokens=x) as m:
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        m.log(0, train_loss=loss.item())
    return run / "step_000000"


def edit_config(folder: Path, change) -> None:
    path = folder / "config.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def edit_readings(folder: Path, change) -> None:
    from safetensors.numpy import load, save

    arrays = load((folder / "readings.safetensors").read_bytes())
    change(arrays)
    raw = save(arrays)
    (folder / "readings.safetensors").write_bytes(raw)
    edit_config(folder, lambda d: d["readings"].update(sha256=hashlib.sha256(raw).hexdigest()))


def edit_weights(folder: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    edit_config(folder, lambda d: d.update(tensors_sha256=digest))


def each_pattern(arrays, cut) -> None:
    for name in [n for n in arrays if n.startswith("sample.pattern.")]:
        arrays[name] = np.ascontiguousarray(cut(arrays[name]))


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


CASES = {  # name -> (change, the CLI that reads it, what its one line says)
    "patterns 10x10 for 13 positions": (lambda f: edit_readings(f, lambda a: each_pattern(a, lambda p: p[:, :, :10, :10])),
                                        entropy, r"readings\.safetensors: 'sample\.pattern\.0' is \[3, 4, 10, 10\]"),
    "one pattern row for three": (lambda f: edit_readings(f, lambda a: each_pattern(a, lambda p: p[:1])),
                                  entropy, r"'sample\.pattern\.0' is \[1, 4, 13, 13\] float32, expected \[3, 4, 13, 13\]"),
    "zero heads": (lambda f: edit_config(f, lambda d: d["model"].update(n_heads=0)), entropy,
                   r"config\.json: 'model\.n_heads' must be a positive number.*got 0"),
    "lens one point short": (lambda f: edit_readings(f, lambda a: a.update({"lens.kl": a["lens.kl"][:, :, :-1].copy()})),
                             logit_lens, r"'lens\.kl' is \[3, 3, 12\] float32, expected \[3, 3, 13\]"),
    "lens.top_ids missing": (lambda f: edit_readings(f, lambda a: a.pop("lens.top_ids")), logit_lens,
                             r"readings\.safetensors: no 'lens\.top_ids'"),
    "-inf probabilities": (lambda f: edit_readings(f, lambda a: a["lens.top_probs"].__setitem__((0, 0, 0, 0), -np.inf)),
                           logit_lens, r"'lens\.top_probs' holds -inf, not a probability"),
    "an id outside the vocabulary": (lambda f: edit_readings(f, lambda a: a["lens.top_ids"].__setitem__((1, 0, 2, 0), 977)),
                                     logit_lens, r"'lens\.top_ids' holds the id 977, outside the model's 40 tokens"),
    "config.json 200,000 deep": (lambda f: (f / "config.json").write_text(nested(200_000)), info,
                                 r"config\.json: not valid JSON \(nested too deep\)"),
    "n_heads NaN": (lambda f: edit_config(f, lambda d: d["model"].update(n_heads=float("nan"))), info,
                    r"'model\.n_heads' .*got nan"),  # json writes NaN, and reads it back
    "d_vocab Infinity": (lambda f: edit_config(f, lambda d: d["model"].update(d_vocab=float("inf"))), entropy,
                         r"'model\.d_vocab' must be a positive number .*got inf"),
    "d_vocab a string": (lambda f: edit_config(f, lambda d: d["model"].update(d_vocab="40")), info,
                         r"'model\.d_vocab' .*got '40'"),
    "layout.missing a string": (lambda f: edit_config(f, lambda d: d["layout"].update(missing="rotary")), entropy,
                                r"'layout\.missing' must map parts"),
    "a weight removed, its hash updated": (lambda f: edit_weights(f, lambda t: t.pop("out_head.weight")), info,
                                           r"model\.safetensors: no tensor 'out_head\.weight'.*the unembedding"),
    "a tensor named ''": (lambda f: edit_weights(f, lambda t: t.update({"": t.pop("final_norm.bias")})), info,
                          r"model\.safetensors: a tensor named \"\""),
    "an int8 embedding": (lambda f: edit_weights(f, lambda t: t.update({"tok_emb.weight": t["tok_emb.weight"].to(
        torch.int8)})), info, r"'tok_emb\.weight' \(the token_embedding\) must be a 2-D floating-point table"),
}


def test_each_disagreement_is_one_line_naming_file_and_field(snapshot, tmp_path, capsys):
    for name, (change, cli, said) in CASES.items():
        folder = tmp_path / re.sub(r"\W+", "_", name)
        shutil.copytree(snapshot, folder)
        change(folder)
        capsys.readouterr()
        assert cli.main(["--ckpt", str(folder)]) == 2, name
        lines = [line for line in "".join(capsys.readouterr()).splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: {folder}"), (name, lines)
        assert re.search(said, lines[0]), (name, lines[0])
    assert entropy.main(["--ckpt", str(snapshot)]) == 0  # the untouched snapshot reads


def test_a_vocab_json_200000_deep_is_one_line(tmp_path):
    (tmp_path / "vocab.json").write_text(nested(200_000))
    with pytest.raises(TokenizerError, match=r"vocab\.json: not valid JSON: nested too deep"):
        CharTokenizer.from_vocab_json(tmp_path / "vocab.json")


def test_a_first_view_whose_arrays_were_changed_is_not_drawn(snapshot, tmp_path, caplog):
    """Every array set to 0.123, the metadata kept: the view is left and the model read, said in the log."""
    from safetensors import safe_open
    from safetensors.numpy import save

    from models.store.files import CheckpointError
    from models.store.view_file import VIEW_FILE, read_view

    folder = tmp_path / "view"
    shutil.copytree(snapshot, folder)
    weights = json.loads((folder / "config.json").read_text())["tensors_sha256"]
    assert read_view(folder, weights) is not None  # as the Monitor wrote it, it is read
    with safe_open(str(folder / VIEW_FILE), framework="numpy") as f:
        metadata, arrays = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    forged = {name: np.full_like(a, 0.123) if a.dtype.kind == "f" else a for name, a in arrays.items()}
    assert any(not np.array_equal(forged[n], arrays[n]) for n in arrays)
    (folder / VIEW_FILE).write_bytes(save(forged, metadata=metadata))
    with caplog.at_level("WARNING", logger="models.store.view_file"):
        assert read_view(folder, weights) is None
    assert "does not hash to what it records" in caplog.text
    (folder / VIEW_FILE).write_bytes(save(arrays, metadata={"first_view": nested(200_000)}))  # every page reads it
    with pytest.raises(CheckpointError, match=r"first_view\.safetensors: not a first view \(RecursionError"):
        read_view(folder, weights)


USER_CODE = '''import torch
import gpt_kit

BUILT_ON = []  # the device each construction ran on


class PerHeadGPT(gpt_kit.PerHeadGPT):
    def __init__(self, **kwargs):
        BUILT_ON.append(torch.empty(0).device.type)
        super().__init__(**kwargs)
'''


def test_model_code_builds_only_its_own_class_and_never_what_the_file_asks_blindly(snapshot, tmp_path, capsys):
    import sys

    from models.store import load_checkpoint
    from models.store.files import CheckpointError

    code = tmp_path / "mygpt.py"
    code.write_text(USER_CODE)
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(0)\n")
    kit = Path(__file__).parent / "gpt_kit" / "tutorial.py"
    with pytest.raises(CheckpointError, match=r"step_000000 is a snapshot of a PerHeadGPT, not of SplitGPT"):
        load_checkpoint(snapshot, model_code=f"{kit}:SplitGPT")
    capsys.readouterr()
    assert entropy.main(["--ckpt", str(snapshot), "--model-code", f"{exits}:PerHeadGPT"]) == 2  # it exited 0, silent
    lines = [line for line in "".join(capsys.readouterr()).splitlines() if line.strip()]
    assert len(lines) == 1 and "importing" in lines[0] and "it called sys.exit(0)" in lines[0], lines
    folder = tmp_path / "huge"
    shutil.copytree(snapshot, folder)
    edit_config(folder, lambda d: d.update(model_args={"vocab": 1_000_000}))  # 256 MB of tables, were it built
    with pytest.raises(CheckpointError, match=r"size mismatch for out_head\.weight: \[1000000, 32\] built, \[40, 32\]"):
        load_checkpoint(folder, model_code=f"{code}:PerHeadGPT")
    assert sys.modules["scratchscope_model_code.mygpt"].BUILT_ON == ["meta"]  # only on the meta device
    edit_config(folder, lambda d: d.update(model_args={"vocab": 3e8}))  # 38 GB: past any size of it, never called
    with pytest.raises(CheckpointError, match=r"config\.json's model_args\.vocab is 300000000\.0, larger than"):
        load_checkpoint(folder, model_code=f"{code}:PerHeadGPT")
    assert sys.modules["scratchscope_model_code.mygpt"].BUILT_ON == []
    edit_config(folder, lambda d: d.update(model_args={"vocab": VOCAB}))
    assert type(load_checkpoint(folder, model_code=f"{code}:PerHeadGPT").model).__name__ == "PerHeadGPT"
    assert sys.modules["scratchscope_model_code.mygpt"].BUILT_ON[-2:] == ["meta", "cpu"]


def test_the_app_gives_a_spec_only_to_snapshots_of_its_class(snapshot, monkeypatch):
    from app.model_code import spec_for

    kit = Path(__file__).parent / "gpt_kit" / "tutorial.py"
    monkeypatch.setattr("sys.argv", ["app"])
    monkeypatch.setenv("SCRATCHSCOPE_MODEL_CODE", f"{kit}:SplitGPT")  # one spec, of another class
    assert spec_for(snapshot) is None
    monkeypatch.setenv("SCRATCHSCOPE_MODEL_CODE", f"{kit}:SplitGPT;{kit}:PerHeadGPT")
    assert spec_for(snapshot) == f"{kit}:PerHeadGPT"


class WithExtraState(PerHeadGPT):
    def get_extra_state(self):
        return {"note": "not a tensor"}

    def set_extra_state(self, state):
        pass


class NeedsMask(PerHeadGPT):
    def forward(self, input_ids, attention_mask):
        return super().forward(input_ids)


def test_the_monitor_refuses_at_construction_what_would_fail_inside_the_loop(tmp_path):
    """Each failed at the first save or eval step, in the user's loop, with a traceback."""
    cases = {"model_args holding an object": (PerHeadGPT, {"model_args": {"norm": object()}},
                                              r"model_args\['norm'\] is not plain JSON data"),
             "get_extra_state": (WithExtraState, {}, r"state_dict holds _extra_state \(dict, from get_extra_state\)"),
             "a forward needing attention_mask": (NeedsMask, {}, r"forward needs attention_mask beside the token ids")}
    x = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    for name, (cls, extra, said) in cases.items():
        model = cls(vocab=VOCAB)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ValueError, match=rf"^Monitor: .*{said}"):
            Monitor(model, optimizer, tmp_path / name.replace(" ", "_"), save_every=1, eval_every=1,
                    report=False, eval_tokens=x, **extra)



def test_the_app_says_in_the_page_what_is_wrong_with_such_a_snapshot(snapshot, tmp_path, monkeypatch):
    """Zero heads (a ZeroDivisionError on the Attention page) and a config.json 200,000 deep (a
    RecursionError on every page): the run's pages show one line, never a traceback."""
    from app_kit import open_app

    runs = tmp_path / "runs"
    for name, change in (("zero_heads", lambda f: edit_config(f, lambda d: d["model"].update(n_heads=0))),
                         ("deep", lambda f: (f / "config.json").write_text(nested(200_000)))):
        shutil.copytree(snapshot.parent, runs / name)
        change(runs / name / snapshot.name)
    for name, said in (("zero_heads", "'model.n_heads' must be a positive number"), ("deep", "nested too deep")):
        at = open_app(monkeypatch, [runs], page="attention", run=name)
        shown = [e.value for e in at.error]
        assert not at.exception and any(said in e for e in shown), (name, shown)
