"""Where a tuned lens lives and what it records: `<snapshot>.tuned_lens.safetensors` (the
translators) and `<snapshot>.tuned_lens.json` (what they were trained for), beside the snapshot
directory, never inside it.

Beside and not inside, because a snapshot's files are hash-checked and written by training in one
atomic swap (a lens written into it would be lost on the next save of that step, or make the
snapshot look modified); beside and not in a `tuned_lens/` folder, because then a lone snapshot
(not in a run) and a series `.pt` file get theirs the same way: `x.pt` -> `x.pt.tuned_lens.*`.
Run readers ignore the two files: a snapshot is a `step_NNNNNN` *directory*.

The JSON records the model config's sha256 (canonical JSON of the parsed model config), the
weights' sha256 (the one the snapshot's config.json records, or one over the state dict for a
`.pt`), the layer labels, d_model, d_vocab, the training steps, batch, lr and seed, the data's
path and sha256, and the sha256 of the safetensors file (a crash between the two atomic writes
leaves a pair that does not match, and loading says so). `check_fits` refuses a lens whose
shapes, config hash or weights hash differ from the model's, with one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from models.config import ADDED_FIELDS
from models.store.files import dumps_json, write_bytes_atomic
from models.store.files import writing
from probes.errors import ProbeInputError

FORMAT = "scratchscope.tuned_lens"
VERSION = 1
SUFFIX = ".tuned_lens"


def lens_paths(snapshot_path: str | Path, explicit: str | Path | None = None) -> tuple[Path, Path]:
    """(safetensors, json) of the tuned lens of the snapshot (directory or .pt file) at a path,
    or of an `explicit` `.safetensors` path (its JSON: the same name ending in `.json`)."""
    if explicit is not None:
        tensors = Path(explicit)
        if tensors.suffix != ".safetensors":
            raise ProbeInputError(f"--lens {tensors}: give the translators' .safetensors file")
        return tensors, tensors.with_suffix(".json")
    path = Path(snapshot_path)
    return (path.with_name(path.name + SUFFIX + ".safetensors"),
            path.with_name(path.name + SUFFIX + ".json"))


def has_lens(snapshot_path: str | Path) -> bool:
    return all(p.is_file() for p in lens_paths(snapshot_path))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def config_sha256(config: Any) -> str:
    """sha256 of the model config as canonical JSON (sorted keys): the architecture's identity. A
    field added to the configs later, at the value that means "as before" (`ADDED_FIELDS`), is left
    out, so a lens saved before the field existed still matches its model."""
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    fields = {k: v for k, v in fields.items() if k not in ADDED_FIELDS or v != ADDED_FIELDS[k]}
    return sha256_bytes(json.dumps(fields, sort_keys=True, default=str).encode())


def weights_sha256(snap: Any) -> str:
    """The sha256 the snapshot's config.json records for its weights (checked on load), or for a
    model without one (a series .pt) a sha256 over its state dict's names, shapes and bytes."""
    recorded = (getattr(snap, "meta", None) or {}).get("tensors_sha256")
    if recorded:
        return str(recorded)
    digest = hashlib.sha256()
    for name, tensor in sorted(snap.model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def model_record(snap: Any, labels: list[str], d_model: int, d_vocab: int) -> dict[str, Any]:
    """What a lens must match: config hash, weights hash, layer labels (the embedding, then each
    block: n_layers + 1) and sizes (as the lens reads the model: ours and any other alike)."""
    return {"model_config_sha256": config_sha256(snap.config), "weights_sha256": weights_sha256(snap),
            "layers": list(labels), "n_layers": len(labels) - 1, "d_model": int(d_model),
            "d_vocab": int(d_vocab)}


def save_lens(tensors_path: Path, json_path: Path, weight: torch.Tensor, bias: torch.Tensor,
              record: dict[str, Any]) -> None:
    """Write weight [layer d_model d_model] and bias [layer d_model] and the JSON record, both
    atomically, the JSON last (it carries the safetensors file's sha256)."""
    data = save({"weight": weight.detach().float().cpu().contiguous(),
                 "bias": bias.detach().float().cpu().contiguous()})
    meta = {"format": FORMAT, "version": VERSION, **record, "tensors_sha256": sha256_bytes(data),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with writing(tensors_path.parent):  # a read-only or full disk: one line naming the folder
        write_bytes_atomic(tensors_path, data)
        write_bytes_atomic(json_path, (dumps_json(meta, indent=2) + "\n").encode())


def read_lens(tensors_path: Path, json_path: Path) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(weight, bias, record) as saved; ProbeInputError (one line) for a missing, corrupt or
    mismatched pair. Does not compare with a model: see `check_fits`."""
    for path in (tensors_path, json_path):
        if not path.is_file():
            raise ProbeInputError(f"{path}: no tuned lens there")
    try:
        meta = json.loads(json_path.read_text(encoding="utf-8"))
        data = tensors_path.read_bytes()
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ProbeInputError(f"{json_path}: not a readable tuned-lens record ({err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ProbeInputError(f"{json_path}: not a tuned-lens record (no \"format\": \"{FORMAT}\")")
    if meta.get("version") != VERSION:
        raise ProbeInputError(f"{json_path}: tuned-lens version {meta.get('version')!r}; this "
                              f"scratchscope reads version {VERSION}")
    if sha256_bytes(data) != meta.get("tensors_sha256"):
        raise ProbeInputError(f"{tensors_path}: sha256 differs from the one {json_path.name} records "
                              "(modified, or a save was interrupted): retrain the tuned lens")
    try:
        tensors = load(data)
        weight, bias = tensors["weight"], tensors["bias"]
    except (SafetensorError, KeyError, ValueError, RuntimeError) as err:
        raise ProbeInputError(f"{tensors_path}: not a tuned-lens safetensors file ({err})") from None
    return weight, bias, meta


def check_fits(meta: dict[str, Any], weight: torch.Tensor, bias: torch.Tensor,
               expected: dict[str, Any], source: Path) -> None:
    """Refuse, in one line, a lens trained for another model: shapes first (the clearest
    message), then the config hash, then the weights hash."""
    n, d = len(expected["layers"]) - 1, expected["d_model"]
    have = f"{meta.get('n_layers')} layers of d_model {meta.get('d_model')}"
    want = f"{expected['n_layers']} layers of d_model {d}"
    if tuple(weight.shape) != (n, d, d) or tuple(bias.shape) != (n, d) or have != want:
        raise ProbeInputError(f"{source}: tuned lens for another model: it holds translators "
                              f"{tuple(weight.shape)} for {have}; this model has {want}")
    for key, what in (("model_config_sha256", "model config"), ("weights_sha256", "weights")):
        if meta.get(key) != expected[key]:
            raise ProbeInputError(f"{source}: tuned lens for another model: its {what} sha256 is "
                                  f"{str(meta.get(key))[:12]}..., this model's is {expected[key][:12]}... "
                                  "(retrain it for this snapshot)")
    if meta.get("layers") != expected["layers"]:
        raise ProbeInputError(f"{source}: tuned lens for layers {meta.get('layers')}, this model's lens "
                              f"reads {expected['layers']}")
