"""What every probe shares: turning text into context-sized windows and reading the CLIs' text and
snapshots into token batches. How a CLI ends (JSON or table, warnings, exit codes) is `probes.cli`;
the attention probes' way into a model is `probes.sources.source_of` (`probes.sources.attention`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from models.cli import to_jsonable  # noqa: F401  (re-exported for probes)
from models.loss import block_len
from models.store.any_model import SavedModel, code_hint
from probes.args import add_input_arguments  # noqa: F401  (torch-free; re-exported for callers)
from probes.errors import ProbeInputError  # noqa: F401  (re-exported for probes)
from probes.run_text import NO_INPUT, default_text, shown, validation_split

log = logging.getLogger(__name__)



def hook_names(model: Any) -> set[str]:
    return set(getattr(model, "hook_dict", {}))


def per_query_head(weights: torch.Tensor, n_heads: int) -> torch.Tensor:
    """A head-stacked weight [head ...] with one row per query head: grouped-query attention
    (Llama, SmolLM) stores K and V for n_kv < n_heads heads, query head h reading kv head
    h // (n_heads / n_kv), as Hugging Face's `repeat_kv` and TransformerLens expand them."""
    n_kv = weights.shape[0]
    if n_kv == n_heads or n_kv < 1 or n_heads % n_kv:
        return weights
    return weights.repeat_interleave(n_heads // n_kv, dim=0)  # [n_heads ...]


def encode_text(tokenizer: Any, text: str) -> list[int]:
    if tokenizer is None:
        raise ProbeInputError("this checkpoint has no tokenizer, so text cannot be encoded: give its "
                              "tokenizer files (the series' vocab.json, nanoGPT's meta.pkl with --tokenizer, "
                              "GPT-2's tokenizer.json), or token ids")
    if not text:
        raise ProbeInputError("the text is empty: give at least one character")
    try:
        ids = tokenizer.encode(text)
    except ValueError as err:  # our UnknownTokenError names the character and its position
        raise ProbeInputError(str(err).splitlines()[0]) from None
    if not ids:
        raise ProbeInputError("the text encodes to zero tokens")
    return list(ids)


def windows(ids: Sequence[int], n_ctx: int) -> list[torch.Tensor]:
    """Split a long id sequence into consecutive windows of n_ctx (the last may be shorter).

    Returns [1 pos] tensors; `batches_of_windows` groups equal lengths for batching.
    """
    if n_ctx < 1:
        raise ProbeInputError(f"context length must be >= 1, got {n_ctx}")
    return [torch.tensor(ids[i:i + n_ctx], dtype=torch.long).unsqueeze(0)
            for i in range(0, len(ids), n_ctx)]


def batches_of_windows(chunks: list[torch.Tensor], batch_size: int) -> Iterator[torch.Tensor]:
    """Stack equal-length [1 pos] windows into [batch pos] batches of at most batch_size."""
    by_len: dict[int, list[torch.Tensor]] = {}
    for chunk in chunks:
        by_len.setdefault(chunk.shape[1], []).append(chunk)
    for group in by_len.values():
        for i in range(0, len(group), batch_size):
            yield torch.cat(group[i:i + batch_size])


def text_batches(tokenizer: Any, text: str, n_ctx: int, batch_size: int) -> list[torch.Tensor]:
    """Text as the CLIs read `--text`: encoded, cut into n_ctx windows, batched by length."""
    chunks = windows(encode_text(tokenizer, text), n_ctx)
    return list(batches_of_windows(chunks, max(1, batch_size)))


def model_tokenizer(model: Any, tokenizer: Any = None) -> Any:
    """The explicit tokenizer, else `model.tokenizer` (ours once loaded from a checkpoint, a
    TransformerBridge's HuggingFace one), else None."""
    return tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)


def text_ids(model: Any, tokens: Any, tokenizer: Any = None) -> Any:
    """A runner's `tokens`: ids ([batch pos] or a list of batches) pass through unchanged; text is
    encoded once with the runner's tokenizer (default `model.tokenizer`): [1 pos], not windowed."""
    if not isinstance(tokens, str):
        return tokens
    tokenizer = model_tokenizer(model, tokenizer)
    if tokenizer is None:
        raise ProbeInputError(f"{type(model).__name__} has no tokenizer to encode the text with: "
                              "pass tokenizer=..., load the model from a checkpoint, or give token ids")
    return torch.tensor(encode_text(tokenizer, tokens), dtype=torch.long).unsqueeze(0)


def tokens_or_text(model: Any, tokens: Any, tokenizer: Any = None, batch_size: int = 16,
                   n_ctx: int | None = None) -> Any:
    """`text_ids`, text then windowed as the CLIs window `--text` (n_ctx defaults to the context
    of the model's cfg)."""
    if not isinstance(tokens, str):
        return tokens
    ids = text_ids(model, tokens, tokenizer)[0].tolist()
    check_batch_size(batch_size)
    n_ctx = int(require_cfg(model, "cut its text into windows").n_ctx) if n_ctx is None else n_ctx
    return list(batches_of_windows(windows(ids, n_ctx), max(1, batch_size)))


def as_batches(tokens: torch.Tensor | Iterable[torch.Tensor], n_ctx: int, d_vocab: int,
               batch_size: int = 16) -> list[torch.Tensor]:
    """[batch pos] tokens (or a list of such batches) as batches of windows of at most n_ctx."""
    check_batch_size(batch_size)
    parts = [tokens] if isinstance(tokens, torch.Tensor) else list(tokens)
    out: list[torch.Tensor] = []
    for part in parts:
        part = part.unsqueeze(0) if part.dim() == 1 else part
        if part.dim() != 2 or part.dtype.is_floating_point or part.dtype == torch.bool:
            raise ProbeInputError(f"tokens must be integer ids of shape [batch pos], got "
                                  f"{part.dtype} {tuple(part.shape)}")
        if part.numel() == 0:
            raise ProbeInputError("no tokens: give at least one token per window")
        low, high = int(part.min()), int(part.max())
        if low < 0 or high >= d_vocab:
            raise ProbeInputError(f"token id {low if low < 0 else high} is outside the vocabulary [0, {d_vocab})")
        if part.shape[1] > n_ctx:
            chunks = [w for row in part.tolist() for w in windows(row, n_ctx)]
            out.extend(batches_of_windows(chunks, max(1, batch_size)))
        else:
            out.extend(torch.split(part.long(), max(1, batch_size)))
    if not out:
        raise ProbeInputError("no tokens: give at least one batch")
    return out


def model_device(model: Any) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without any)."""
    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def require_cfg(model: Any, why: str) -> Any:
    """The model's config (ours or a TransformerBridge's), or one line saying that this probe needs
    one: a module we never rebuilt (nanochat's GPT, a tutorial GPT) has none, and only the probes
    that read attention reach it (through models.tap)."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "n_ctx"):
        raise ProbeInputError(f"{type(model).__name__} is not one of our models or a TransformerBridge, so this "
                              f"probe cannot {why}; the attention probes (entropy, degenerate, heads) read any "
                              "model, and the Monitor measures its MLP units where the activation is a module")
    return cfg


def lm_windows(model: Any, tokens: torch.Tensor | Iterable[torch.Tensor], batch_size: int = 16,
               targets: bool = True) -> list[torch.Tensor]:
    """`tokens` cut into the windows a model reads, as [batch pos] batches.

    With `targets`, a window is a training block (n_ctx + 1 tokens for a transformer, 2 * n_ctx
    for the MLP family, whose n_ctx-token window slides); windows too short to predict anything
    are left out. Without, n_ctx tokens (transformer) or up to 2 * n_ctx - 1 (MLP) per window.
    """
    cfg = require_cfg(model, "cut its text into windows")
    transformer = getattr(cfg, "family", "transformer") == "transformer"
    length = block_len(cfg) - (0 if targets else 1)
    shortest = (2 if transformer else cfg.n_ctx + 1) - (0 if targets else 1)
    batches = [b for b in as_batches(tokens, length, cfg.d_vocab, batch_size) if b.shape[1] >= shortest]
    if not batches:
        raise ProbeInputError(f"too few tokens: a window of this model needs at least {shortest}")
    return batches


def progress_bar(batches: Sequence[torch.Tensor], progress: bool | None, desc: str) -> Iterable[torch.Tensor]:
    """tqdm over batches on stderr; by default only for 2+ batches on a terminal."""
    show = progress if progress is not None else (len(batches) > 1 and sys.stderr.isatty())
    if not show:
        return batches
    from tqdm.auto import tqdm
    return tqdm(batches, desc=desc, unit="batch", file=sys.stderr)


TINY_WEIGHTS = 16 * 2**20  # bytes of weights (4M float32 parameters) below which a model reads on one thread


@contextmanager
def one_thread_if_tiny(weights: Path | None) -> Iterator[None]:
    """Torch on one thread while a tiny model (its weights file under TINY_WEIGHTS) is read: on
    matrices this small torch's threads cost more than they give (on a busy 2-core machine a
    product took 20 ms instead of 10 us: benchmarks/bench_development.py)."""
    tiny = weights is not None and weights.stat().st_size < TINY_WEIGHTS
    before = torch.get_num_threads()
    if tiny:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if tiny:
            torch.set_num_threads(before)


def check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ProbeInputError(f"batch size must be >= 1, got {batch_size}")
    if batch_size > 65536:
        raise ProbeInputError(f"batch size {batch_size} is more windows than one forward pass can "
                              "hold; use at most 65536 (a few hundred is plenty)")


MAX_TOKENS = 50_000_000  # windows x context a CLI run may hold at once (int64: 400 MB)
MAX_TEXT_BYTES = 256 * 2**20  # what --text-file / --data read at most


def sample_windows(ids: Sequence[int], n_ctx: int, samples: int, seed: int = 0) -> torch.Tensor:
    """`samples` random windows of exactly n_ctx tokens from a long id sequence: [samples n_ctx]."""
    if samples < 1:
        raise ProbeInputError(f"--samples must be >= 1, got {samples}")
    if samples * n_ctx > MAX_TOKENS:
        raise ProbeInputError(f"--samples {samples} windows of {n_ctx} tokens is more than the "
                              f"{MAX_TOKENS:,}-token limit; use fewer samples")
    if len(ids) < n_ctx:
        raise ProbeInputError(f"the data has {len(ids)} tokens, fewer than one context of {n_ctx}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - n_ctx + 1, (samples,), generator=gen)
    data = torch.tensor(ids, dtype=torch.long)
    return torch.stack([data[s:s + n_ctx] for s in starts.tolist()])


def read_text_file(path: Path) -> str:
    """The file's text, at most MAX_TEXT_BYTES of it; a FIFO or a device (/dev/zero never ends) is
    refused unopened: a FIFO's open waits for a writer forever."""
    from probes.doctor.text_log import check_regular_file

    if Path(path).exists() and not Path(path).is_dir():  # those are said below, in the other causes' words
        check_regular_file(Path(path), "a text file", "--text-file / --data")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TEXT_BYTES + 1)
        if len(raw) > MAX_TEXT_BYTES:
            raise ProbeInputError(f"text file {path} is larger than {MAX_TEXT_BYTES // 2**20} MB; "
                                  "cut it, or sample windows from it with --data and --samples")
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise ProbeInputError(f"text file {path} does not exist") from None
    except UnicodeDecodeError as err:
        raise ProbeInputError(f"text file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:  # a directory, no permission, ...
        raise ProbeInputError(f"cannot read text file {path}: {err.strerror}") from None


def token_batches(args: argparse.Namespace, tokenizer: Any, n_ctx: int,
                  snap: Any = None) -> tuple[list[torch.Tensor], str]:
    """The [batch pos] batches a CLI run should see, and a description of where they came from.
    With no --text, --text-file or --data: windows of `snap`'s own text (`default_windows`), or
    the sample a snapshot of any model saved (any other text needs its code: `--model-code`)."""
    check_batch_size(args.batch_size)
    given = args.data is not None or args.text_file is not None or args.text is not None
    if is_saved(snap) and not given:
        sample, source = saved_sample(snap)
        return list(torch.split(sample, max(1, args.batch_size))), source
    if sample_only(snap):
        raise refused(snap.model)
    if tokenizer is None and snap is not None:
        no_tokenizer(snap)
    if given and args.data is None and args.samples is not None:
        log.warning("--samples applies to --data only; ignored for --text / --text-file")
    if args.samples is None:
        args.samples = args.samples_default
    if args.data is not None:
        ids = encode_text(tokenizer, read_text_file(args.data))
        sample = sample_windows(ids, n_ctx, args.samples, args.seed)
        batches = list(torch.split(sample, max(1, args.batch_size)))
        return batches, f"{args.samples} random windows of {n_ctx} from {args.data}"
    if args.text_file is not None:
        text, source = read_text_file(args.text_file), str(args.text_file)
    elif args.text is not None:
        text, source = args.text, "--text"
    else:
        sample, source = default_windows(snap, tokenizer, n_ctx, args.samples, args.seed)
        return list(torch.split(sample, max(1, args.batch_size))), source
    batches = text_batches(tokenizer, text, n_ctx, args.batch_size)
    return batches, f"{source} in {sum(len(b) for b in batches)} window(s)"


def no_tokenizer(snap: Any) -> None:
    """Raise the snapshot's own one line for a checkpoint loaded without a tokenizer: what its
    format needs (nanoGPT's meta.pkl, GPT-2's tokenizer files, the series' vocab.json)."""
    raise ProbeInputError(str(snap.no_tokenizer()))


def default_windows(snap: Any, tokenizer: Any, n_ctx: int, samples: int, seed: int) -> tuple[torch.Tensor, str]:
    """`samples` windows [samples n_ctx] (seeded) from the validation split of the run's recorded
    data, else of the shipped text where the tokenizer encodes it (`probes.run_text`), and one
    line saying so."""
    found = None if snap is None else default_text(snap)
    if found is None:
        raise ProbeInputError(NO_INPUT)
    if tokenizer is None:
        no_tokenizer(snap)
    try:
        ids = encode_text(tokenizer, read_text_file(found.path))
    except ProbeInputError:
        if found.origin != "shipped":
            raise
        raise ProbeInputError(f"{NO_INPUT} (this checkpoint records no data, and its tokenizer "
                              f"cannot encode the shipped {shown(found.path)})") from None
    sample = sample_windows(validation_split(ids, found.val_fraction), n_ctx, samples, seed)
    return sample, found.describe(samples, n_ctx, seed)


@contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """Dropout off inside, the model's mode back after. A model already in eval mode is left
    alone: `.eval()` / `.train()` walk every submodule (a few ms on a small model, more than
    the forward pass a probe on one short window makes)."""
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield
    finally:
        if was_training:
            model.train()


class StopForward(Exception):
    """Raised from a hook once every wanted layer is reduced: the rest of the forward pass (later
    blocks, the unembedding, a large share at GPT-2's vocabulary) would be thrown away."""


# ---------------------------------------------------------------- a snapshot of any model's saved sample

def is_saved(snap: Any) -> bool:
    """A snapshot of any model (loaded with its code or without)."""
    return (getattr(snap, "meta", None) or {}).get("format") == "any-model"


def sample_only(snap: Any) -> bool:
    """A snapshot of any model opened without its code: only the sample it saved can be read."""
    return is_saved(snap) and isinstance(snap.model, SavedModel)


def saved_sample(snap: Any) -> tuple[torch.Tensor, str]:
    """The saved sample's tokens [rows pos] and where they came from, in words."""
    from models.store.any_files import read_readings

    tokens = torch.from_numpy(read_readings(snap.path, snap.meta)["sample.tokens"].copy())
    return tokens, (f"the sample saved at step {snap.meta.get('step')}: {tokens.shape[0]} row(s) of "
                    f"{tokens.shape[1]} eval tokens")


def refused(model: SavedModel) -> ProbeInputError:
    return ProbeInputError(f"{model.path.parent.name}/{model.path.name} holds a {model.architecture}'s readings on "
                           f"its saved sample only, not its code: leave the text out to read that sample, or "
                           f"{code_hint(model.meta)} on any text")


def random_repeat_tokens(d_vocab: int, length: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """`batch` sequences of `length` uniformly random token ids, each repeated twice: [batch 2*length]
    (the input of Olsson et al.'s induction score, `probes.heads`, and of `probes.ablate --repeat`)."""
    if length < 2:
        raise ProbeInputError(f"--length must be at least 2 to repeat anything, got {length}")
    gen = torch.Generator().manual_seed(seed)
    half = torch.randint(0, d_vocab, (batch, length), generator=gen)  # [batch length]
    return torch.cat([half, half], dim=1)
