"""Tiny Hugging Face causal-LM directories written offline, as `save_pretrained` writes them: a
Llama (grouped kv heads), a Qwen2 (attention biases) or a GPT-NeoX (parallel residual, partial
rotary), with a byte-level BPE tokenizer trained on a few lines beside it (or none).

    path = save_hf_dir(tmp_path / "llama", "llama")           # config.json, model.safetensors, tokenizer
    path = save_hf_dir(tmp_path / "bare", "qwen2", tokenizer=False)
"""

from __future__ import annotations

from pathlib import Path

import torch

TEXT = ("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is "
        "the sun.\nArise, fair sun, and kill the envious moon,\n")
VOCAB = 300  # byte-level: 256 bytes + merges + <|endoftext|>
N_CTX = 64


def tiny_tokenizer(vocab: int = VOCAB):
    """A PreTrainedTokenizerFast over a byte-level BPE trained on TEXT (any text encodes)."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([TEXT * 4], vocab_size=vocab, min_frequency=1, show_progress=False,
                            special_tokens=["<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>")


def tiny_config(kind: str, vocab: int = VOCAB):
    """The config of a 2-layer, d_model 32, 4-head model of `kind` (llama, qwen2, gpt_neox)."""
    import transformers

    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=N_CTX, bos_token_id=0, eos_token_id=0)
    if kind == "llama":
        return transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, **common)
    if kind == "qwen2":
        return transformers.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True, **common)
    if kind == "gpt_neox":
        return transformers.GPTNeoXConfig(rotary_pct=0.5, use_parallel_residual=True, **common)
    raise ValueError(f"unknown kind {kind!r}")


def tiny_model(kind: str, vocab: int = VOCAB, seed: int = 0):
    """A random causal LM of `kind` with norm gains away from 1 (a probe that skips them differs)
    and query/key weights large enough that attention is far from uniform."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(kind, vocab))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif any(k in name for k in ("q_proj", "k_proj", "query_key_value")) and p.dim() == 2:
                p.normal_(0.0, 0.6)
    return model.eval()


def save_hf_dir(path: Path, kind: str = "llama", *, tokenizer: bool = True, seed: int = 0) -> Path:
    """`path` holding a tiny `kind` model's save_pretrained files (and its tokenizer's)."""
    path = Path(path)
    tiny_model(kind, seed=seed).save_pretrained(path)
    if tokenizer:
        tiny_tokenizer().save_pretrained(path)
    return path
