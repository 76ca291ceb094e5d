"""Tuned lens (Belrose et al. 2023, "Eliciting Latent Predictions from Transformers with the
Tuned Lens"): the logit lens with a learned affine translator per layer.

    from probes import tuned_lens
    lens = tuned_lens.TunedLens(model)                       # identity translators
    tuned_lens.fit(lens, tuned_lens.training_batches(train_ids, 64, 16, seed=0), steps=500)
    result = logit_lens.run(model, tokens, lens=lens)         # the logit lens's result, tuned

Definition: the residual h_l read after the embedding and after every block but the last is
mapped by A_l h_l + b_l (A_l initialised to the identity, b_l to zero) and then decoded exactly as
the logit lens decodes it (the model's own final norm, recomputed, then W_U + b_U: `LogitLens.decode`,
which `TunedLens.decode` calls after translating). The last block's output needs no translator:
it is the model's own readout. The translators are trained together with Adam on the mean over
layers of KL(final || lens), averaged over every position of random windows of the run's own
training split; the model stays frozen (eval mode, no gradients into it). Evaluation reads other
random windows, from the validation split (the last `val_fraction` of the text, as training split it).

Any model the logit lens reads through its own parts (`models.anatomy`: nanochat's GPT, a user's
GPT rebuilt from a snapshot with `--model-code`) is read the same way: the residual entering block 0
and leaving each block, by torch hooks; a snapshot of such a model opened without its code is
refused in one line (its forward is needed).

Saved beside the snapshot as `<snapshot>.tuned_lens.safetensors` + `.json` (`probes.lens.tuned_file`
says why there and what is checked on load).
"""

from __future__ import annotations

if __name__ == "__main__":  # --help and bad arguments answered before torch is imported (~4 s)
    from probes.args import tuned_lens_parser
    tuned_lens_parser().parse_early()

import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from models.store.any_model import code_hint
from probes import logit_lens
from probes.args import tuned_lens_parser as build_parser
from probes.cli import Shown, run_probe
from probes.common import (ProbeInputError, encode_text, model_device, no_tokenizer, read_text_file,
                           sample_only, sample_windows, to_jsonable)
from probes.lens.result import LogitLensResult
from probes.lens.tuned_file import (check_fits, lens_paths, model_record, read_lens, save_lens,
                                    sha256_bytes)
from probes.logit_lens import LogitLens
from probes.run_text import DefaultText, default_text, shown, val_fraction, validation_split

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the lens

class TunedLens(LogitLens):
    """A LogitLens whose `decode` first applies the translator of that layer: A_l h + b_l.

    weight [layer d_model d_model] and bias [layer d_model], one per point but the last (the
    model's final residual, decoded as is). Without them: identity and zero (the logit lens).
    """

    def __init__(self, model: Any, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        super().__init__(model, include_mid=False)  # refuses a model without a residual stream
        n, d = len(self.points) - 1, self.d_model
        device = model_device(model)
        weight = torch.eye(d).repeat(n, 1, 1) if weight is None else weight  # [layer d_model d_model]
        bias = torch.zeros(n, d) if bias is None else bias  # [layer d_model]
        if tuple(weight.shape) != (n, d, d) or tuple(bias.shape) != (n, d):
            raise ProbeInputError(f"translators {tuple(weight.shape)} + {tuple(bias.shape)} do not fit "
                                  f"{n} layers of d_model {d}")
        self.weight = torch.nn.Parameter(weight.detach().float().to(device).clone())
        self.bias = torch.nn.Parameter(bias.detach().float().to(device).clone())

    @property
    def d_model(self) -> int:
        """Width of the residual stream: ours from its config, any other model (read through its
        anatomy: nanochat's GPT, a user's GPT rebuilt with --model-code) from its token table."""
        if self.anatomy is not None:
            return int(self.anatomy.embedding.weight.shape[1])
        return int(self.model.cfg.d_model)

    @property
    def n_translators(self) -> int:
        return self.weight.shape[0]

    def parameters(self) -> list[torch.nn.Parameter]:
        return [self.weight, self.bias]

    def translate(self, resid: torch.Tensor, layer_index: int) -> torch.Tensor:
        """[... d_model] -> [... d_model]: A_l h + b_l, or h itself at the last point."""
        if layer_index >= self.n_translators:
            return resid
        w, b = self.weight[layer_index], self.bias[layer_index]
        return resid @ w.T.to(resid.dtype) + b.to(resid.dtype)

    def decode(self, resid: torch.Tensor, layer_index: int) -> torch.Tensor:
        return super().decode(self.translate(resid, layer_index), layer_index)


# ---------------------------------------------------------------- training

def residuals_and_final(lens: LogitLens, tokens: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One frozen forward: the residual at each translated point [batch pos d_model] and the
    final log-probabilities [batch pos d_vocab]."""
    model, wanted = lens.model, lens.points[:-1]
    resid: dict[int, torch.Tensor] = {}

    def keep(index: int):
        def hook(x: torch.Tensor, hook: Any) -> None:
            resid[index] = x.detach()
        return hook

    if lens.anatomy is not None:  # no hook points: the blocks' inputs and outputs, by torch hooks
        with torch.no_grad():
            logits, kept = lens.anatomy.residuals(model, tokens)  # [batch pos d_vocab], per point
        return kept[: len(wanted)], logits.float().log_softmax(-1)
    with torch.no_grad(), model.hooks(fwd_hooks=[(p.hook, keep(i)) for i, p in enumerate(wanted)]):
        final = model(tokens).float().log_softmax(-1)  # [batch pos d_vocab]
    return [resid[i] for i in range(len(wanted))], final


def kl_loss(lens: TunedLens, tokens: torch.Tensor) -> torch.Tensor:
    """Mean over translated layers of KL(final || lens) averaged over positions (nats): [] with
    gradients into the translators only."""
    resid, final = residuals_and_final(lens, tokens)
    final = final.flatten(0, 1)  # [batch*pos d_vocab]
    losses = [F.kl_div(lens.decode(h, i).float().flatten(0, 1).log_softmax(-1), final,
                       log_target=True, reduction="batchmean") for i, h in enumerate(resid)]
    return torch.stack(losses).mean()


def training_batches(ids: torch.Tensor, n_ctx: int, batch_size: int, seed: int = 0) -> Iterator[torch.Tensor]:
    """Endless [batch n_ctx] random windows of `ids` [n_tokens], from a seeded generator."""
    if ids.numel() < n_ctx:
        raise ProbeInputError(f"the training text has {ids.numel()} tokens, fewer than one context of {n_ctx}")
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(n_ctx)
    while True:
        starts = torch.randint(0, ids.numel() - n_ctx + 1, (batch_size,), generator=gen)
        yield ids[starts[:, None] + offsets[None, :]]


def fit(lens: TunedLens, batches: Iterator[torch.Tensor], steps: int, lr: float = 3e-3,
        progress: bool | None = None) -> list[float]:
    """Train the translators for `steps` batches with Adam (lr decayed linearly to zero); the
    model is frozen and in eval mode, restored afterwards. Returns the loss of each step."""
    if steps < 1:
        raise ProbeInputError(f"--steps must be >= 1, got {steps}")
    model, device = lens.model, model_device(lens.model)
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    optimizer = torch.optim.Adam(lens.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / steps)
    losses: list[float] = []
    bar = _progress(steps, progress)
    model.eval().requires_grad_(False)
    try:
        with torch.enable_grad():
            for _ in range(steps):
                loss = kl_loss(lens, next(batches).to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                schedule.step()
                losses.append(float(loss.detach()))
                if bar is not None:
                    bar.set_postfix(kl=f"{losses[-1]:.4f}")
                    bar.update()
    finally:
        if bar is not None:
            bar.close()
        model.train(was_training)
        for p, flag in flags:
            p.requires_grad_(flag)
    return losses


def _progress(steps: int, progress: bool | None) -> Any:
    if not (progress if progress is not None else sys.stderr.isatty()):
        return None
    from tqdm.auto import tqdm
    return tqdm(total=steps, desc="tuned lens", unit="step", file=sys.stderr)


# ---------------------------------------------------------------- the run's text

@dataclass
class Corpus:
    path: Path
    sha256: str
    train: torch.Tensor  # [n_train] ids: translators are trained here
    val: torch.Tensor  # [n_val] ids: and evaluated here
    origin: str = "given"  # given (--data) | run (run.json's data) | shipped (the checkpoint records none)


def read_corpus(snap: Any, path: Path | None) -> Corpus:
    """The text (`path`, else the run's recorded data, else the shipped text where the snapshot's
    tokenizer encodes it: `probes.run_text`) encoded and split as training split it."""
    found = DefaultText(Path(path), "given", val_fraction(snap)) if path is not None else default_text(snap)
    if found is None:
        raise ProbeInputError(f"{snap.path}: its run records no data file that exists here: give --data FILE")
    if snap.tokenizer is None:
        no_tokenizer(snap)
    text = read_text_file(found.path)
    try:
        ids = torch.tensor(encode_text(snap.tokenizer, text), dtype=torch.long)  # [n_tokens]
    except ProbeInputError:
        if found.origin != "shipped":
            raise
        raise ProbeInputError(f"{snap.path}: it records no data, and its tokenizer cannot encode the "
                              f"shipped {shown(found.path)}: give --data FILE") from None
    val = torch.as_tensor(validation_split(ids, found.val_fraction))
    train = ids[: len(ids) - len(val)] if len(val) < len(ids) else ids
    return Corpus(found.path, sha256_bytes(text.encode("utf-8")), train, val, found.origin)


# ---------------------------------------------------------------- save, load, compare

def load(snap: Any, path: str | Path | None = None) -> TunedLens:
    """The tuned lens saved beside the snapshot (or the `.safetensors` at `path`), checked against
    the model: ProbeInputError (one line) when it was trained for another one."""
    tensors_path, json_path = lens_paths(snap.path, path)
    base = TunedLens(snap.model)  # an MLP-family model is refused here, before the file is read
    weight, bias, meta = read_lens(tensors_path, json_path)
    check_fits(meta, weight, bias, model_record(snap, base.labels, base.d_model, base.d_vocab), tensors_path)
    lens = TunedLens(snap.model, weight, bias)
    lens.meta = meta
    return lens


def train_and_save(snap: Any, corpus: Corpus, steps: int, *, batch_size: int = 16, lr: float = 3e-3,
                   seed: int = 0, progress: bool | None = None, path: str | Path | None = None,
                   force: bool = False) -> TunedLens:
    """Train translators for the snapshot on the corpus's training split and save them beside it
    (or at `path`, its folder made); the lens carries its record as `.meta`. A lens already there
    (the shipped run's is tracked by git) is replaced only with `force`."""
    files = lens_paths(snap.path, path)  # a bad path is refused before minutes of training
    lens = TunedLens(snap.model)
    n_ctx = context(snap, lens)
    refuse_nonfinite(snap, corpus.train[:n_ctx].unsqueeze(0))
    if not force and any(f.exists() for f in files):
        raise ProbeInputError(f"{files[0]}: a tuned lens is already there: give --force to replace it, or "
                              "--lens PATH.safetensors to save another one elsewhere (nothing was trained)")
    if path is not None:
        files[0].parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    losses = fit(lens, training_batches(corpus.train, n_ctx, batch_size, seed), steps, lr, progress)
    record = {**model_record(snap, lens.labels, lens.d_model, lens.d_vocab), "snapshot": Path(snap.path).name,
              "steps": steps, "batch_size": batch_size, "n_ctx": n_ctx, "lr": lr, "seed": seed,
              "optimizer": "adam, lr decayed linearly to 0", "final_loss": losses[-1],
              "data": {"path": _portable(corpus.path), "sha256": corpus.sha256}}
    save_lens(*files, lens.weight, lens.bias, record)
    lens.meta = record
    return lens


def context(snap: Any, lens: LogitLens) -> int:
    """The windows' length: the model's context, else the one its snapshot recorded (a user's GPT
    that names none), else the lens's default of one window of the text."""
    recorded = getattr(getattr(snap, "config", None), "n_ctx", None)
    n_ctx = lens.n_ctx or (recorded if isinstance(recorded, int) and recorded > 0 else None)
    if n_ctx is None:
        raise ProbeInputError(f"{snap.path}: neither the model nor its snapshot names a context: the tuned lens "
                              "trains on windows of the context")
    return int(n_ctx)


def refuse_nonfinite(snap: Any, window: torch.Tensor) -> None:
    """A diverged snapshot (weights holding NaN or inf, or so large that its logits are) gives NaN
    translators: refused in one line before any training. window: [1 pos] of the training text."""
    bad = snap.nonfinite_params() if hasattr(snap, "nonfinite_params") else []
    if not bad:
        with torch.no_grad():
            logits = snap.model(window.to(model_device(snap.model)))  # [1 pos vocab]
        if bool(torch.isfinite(logits).all()):
            return
        largest = max(float(p.detach().abs().max()) for p in snap.model.parameters())
        bad = [f"its logits are NaN or inf on the text; its largest weight is {largest:.3g}"]
    raise ProbeInputError(f"{snap.path}: a diverged snapshot ({bad[0]}{' and more' if len(bad) > 1 else ''}): "
                          "a tuned lens trained on it would be NaN; train one on an earlier snapshot "
                          "(nothing was trained)")


def _portable(path: Path) -> str:
    """The data path as the run records paths: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dataclass
class Comparison:
    """The logit lens and the tuned lens on the same windows."""

    logit: LogitLensResult
    tuned: LogitLensResult
    meta: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({"layers": self.logit.layers, "source": self.logit.source,
                            "logit_lens": {"kl_to_final": self.logit.kl_to_final,
                                           "cross_entropy": self.logit.cross_entropy},
                            "tuned_lens": {"kl_to_final": self.tuned.kl_to_final,
                                           "cross_entropy": self.tuned.cross_entropy},
                            "trained": {k: self.meta.get(k) for k in ("steps", "batch_size", "lr", "seed",
                                                                      "data", "final_loss")}})

    def format(self) -> str:
        lines = [f"logit lens vs tuned lens on {self.logit.source}",
                 f"{'layer':<8}{'KL logit':>10}{'KL tuned':>10}{'CE logit':>10}{'CE tuned':>10}"]
        for row in zip(self.logit.layers, self.logit.kl_to_final, self.tuned.kl_to_final,
                       self.logit.cross_entropy, self.tuned.cross_entropy):
            lines.append(f"{row[0]:<8}" + "".join(f"{v:>10.4f}" for v in row[1:]))
        m = self.meta
        lines.append(f"(translators: {m.get('steps')} steps of {m.get('batch_size')} windows, lr {m.get('lr')}, "
                     f"seed {m.get('seed')}, on {(m.get('data') or {}).get('path')})")
        return "\n".join(lines)


def compare(model: Any, lens: TunedLens, tokens: Any, *, k: int = 5, batch_size: int = 16,
            progress: bool | None = None, source: str | None = None) -> Comparison:
    logit = logit_lens.run(model, tokens, k=k, batch_size=batch_size, progress=progress, source=source)
    tuned = logit_lens.run(model, tokens, k=k, lens=lens, batch_size=batch_size, progress=progress,
                           source=source)
    return Comparison(logit, tuned, getattr(lens, "meta", {}))


# ---------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    return run_probe(build_parser, argv, from_args)


def from_args(args: Any) -> Shown:
    from models.checkpoint import load_from_args
    snap = load_from_args(args)
    if sample_only(snap):  # a snapshot of any model without its code: nothing to run the lens through
        raise ProbeInputError(f"{snap.path}: a tuned lens trains on the model's residual stream, and this "
                              f"snapshot of a {snap.model.architecture} holds its weights without its code: "
                              f"{code_hint(snap.meta)}")
    base = LogitLens(snap.model)  # an MLP-family model: one line before any data is read
    corpus = read_corpus(snap, args.data)
    if args.eval:
        lens = load(snap, args.lens)
    else:
        lens = train_and_save(snap, corpus, args.steps, batch_size=args.batch_size, lr=args.lr,
                              seed=args.seed, progress=args.progress, path=args.lens, force=args.force)
        print(f"saved {lens_paths(snap.path, args.lens)[0]} (final training KL "
              f"{lens.meta['final_loss']:.4f})", file=sys.stderr)
    n_ctx = context(snap, base)
    windows = sample_windows(corpus.val.tolist(), n_ctx, args.samples, args.seed + 1)
    text = DefaultText(corpus.path, corpus.origin, val_fraction(snap))
    source = text.describe(args.samples, n_ctx, args.seed + 1)
    result = compare(snap.model, lens, windows, batch_size=args.batch_size, progress=args.progress,
                     source=source)
    diverged = not all(math.isfinite(v) for v in result.tuned.kl_to_final)
    warnings = ["the tuned lens's KL is NaN or inf at some layer (a diverged model?)"] if diverged else []
    return Shown.of(result, warnings=warnings)


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
