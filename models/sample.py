"""Continue a prompt with a model: greedy or sampled, the way the series judged every model.

    python -m models.sample --ckpt checkpoints/shakespeare_rms4 --prompt "ROMEO:" --tokens 200
    python -m models.sample --ckpt checkpoints/shakespeare_gpt --prompt "ROMEO:" --greedy

Notebook: `generate(model, tokens, max_new_tokens=100, temperature=0.8, seed=0)`.
"""

from __future__ import annotations

if __name__ == "__main__":  # Ctrl-C/SIGTERM: one line from here on; --help and bad arguments
    from models.interrupts import quiet_signals  # answered before torch is imported (~4 s)
    quiet_signals()
    from models.parsers import sample_parser
    sample_parser().parse_early()

from typing import Any

import torch

from models.parsers import sample_parser as build_parser
from models.tap import logits_of


@torch.no_grad()
def generate(model: Any, tokens: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, greedy: bool = False, seed: int | None = None,
             vocab_size: int | None = None, config: Any = None) -> torch.Tensor:
    """tokens [1 pos] -> [1 pos + max_new_tokens]: each step reads the last n_ctx tokens.
    `vocab_size` (the tokenizer's) keeps the draw off the padding rows of a larger embedding
    (nanoGPT pads GPT-2's 50257 tokens to 50304: those ids have no text).

    Greedy takes the most likely token; otherwise it samples from softmax(logits / temperature),
    restricted to the `top_k` most likely tokens when given; `seed` makes the draw repeatable.
    The MLP family needs at least n_ctx prompt tokens (its window is fixed). `config` is the
    checkpoint's own (`Snapshot.config`: a bridge's or nanochat's shape); ours by default.
    """
    cfg = config if config is not None else model.cfg
    if tokens.dim() != 2 or tokens.shape[0] != 1 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be [1 pos] with pos >= 1, got {tuple(tokens.shape)}")
    if getattr(cfg, "family", "transformer") == "mlp" and tokens.shape[1] < cfg.n_ctx:
        raise ValueError(f"this MLP model reads windows of {cfg.n_ctx} tokens: give a prompt of at "
                         f"least {cfg.n_ctx}, got {tokens.shape[1]}")
    if not greedy and not (temperature > 0 and temperature < float("inf")):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if max_new_tokens < 0:
        raise ValueError(f"the number of new tokens must be >= 0, got {max_new_tokens}")
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    device = next(model.parameters()).device
    out = tokens.to(device)
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            # a tutorial's (logits, loss) or Hugging Face's .logits too
            logits = logits_of(model(out[:, -cfg.n_ctx:]))[0, -1, :vocab_size].float().cpu()  # [vocab]
            out = torch.cat([out, _pick(logits, temperature, top_k, greedy, gen).to(device).view(1, 1)], 1)
    finally:
        model.train(was_training)
    return out


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, greedy: bool,
          gen: torch.Generator | None) -> torch.Tensor:
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("the model's logits are NaN or inf (a diverged model): nothing to sample")
    if greedy:
        return logits.argmax()
    if top_k is not None and top_k < logits.numel():
        cutoff = logits.topk(top_k).values[-1]
        logits = logits.masked_fill(logits < cutoff, float("-inf"))
    probs = torch.softmax(logits.double() / temperature, dim=-1)  # [vocab]
    return torch.multinomial(probs, 1, generator=gen)[0]


def continue_text(snap: Any, prompt: str, max_new_tokens: int, **kwargs: Any) -> str:
    """The prompt's continuation as text (the prompt itself left out)."""
    if snap.tokenizer is None:
        raise ValueError("this checkpoint has no tokenizer, so a text prompt cannot be encoded")
    if not prompt:
        raise ValueError("the prompt is empty: give at least one character")
    ids = torch.tensor([snap.tokenizer.encode(prompt)])  # [1 pos]; unknown characters raise
    out = generate(snap.model, ids, max_new_tokens, vocab_size=snap.tokenizer.vocab_size, config=snap.config,
                   **kwargs)
    return snap.tokenizer.decode(out[0, ids.shape[1]:].tolist())


def main(argv: list[str] | None = None) -> int:
    from models.checkpoint import load_from_args
    from models.cli import run_cli

    def body() -> int:
        args = build_parser().parse_args(argv)
        snap = load_from_args(args)
        print(args.prompt + continue_text(snap, args.prompt, args.tokens, temperature=args.temperature,
                                          top_k=args.top_k, greedy=args.greedy, seed=args.seed))
        return 0

    return run_cli(body)


if __name__ == "__main__":
    from models.cli import exit_entry
    exit_entry(main())
