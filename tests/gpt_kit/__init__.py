"""The test kit of hand-written GPTs: the layouts people write, in our own words, tiny and CPU-fast,
nothing downloaded. One file per style family; the model files (`tutorial`, `einsum`, `llama`)
import torch only, so `--model-code tests/gpt_kit/FILE.py:NAME` rebuilds their models from a
snapshot as it would a user's file.

- `tutorial.py`: one module per head (`PerHeadGPT`), batched heads from a packed qkv (`BatchedGPT`,
  on SDPA `SdpaGPT`), separate q/k/v with a tied unembedding (`SplitGPT`), torch's
  `nn.MultiheadAttention` (`MhaGPT`); `tokens()`, `causal_hidden()`.
- `einsum.py`: scores by einsum (`EinsumGPT`), its blocks returning a delta the parent adds
  (`DeltaGPT`), and the einsum style under names no list knows (`HandEinsumGPT`).
- `llama.py`: RMSNorm, SwiGLU, rotary, a fused wqkv, tied (`LlamaGPT`; `HandLlama` under names no
  list knows).
- `nanochat.py`: nanochat's layout (`ChatGPT`) and nanochat's own GPT, small (`nanochat_gpt`).
- `hf.py`: Hugging Face Llama / Qwen2 in memory (`hf_model`, `hf_pair`, `hf_patterns`).
- `patterns.py`: a kit model's own attention patterns (`own_patterns`).
- `runs.py`: short Monitor runs of them (`train_with_monitor`, `train_run`, `run_json`, `TEXT`).
- `series.py`: the blog series' own models, copied as written (`Series*`, `series_model`): import
  them from `gpt_kit.series`, whose small sizes (`VOCAB, N, D, ...`) are its own.

The sizes exported here (`VOCAB, CTX, D, HEADS`) are those of tutorial.py, nanochat.py and hf.py;
einsum.py and llama.py have their own (`CONTEXT` 64, `WIDTH` 32, ...): import those from their file.
"""

from .einsum import DeltaGPT, EinsumGPT, HandEinsumGPT
from .hf import hf_config, hf_model, hf_pair, hf_patterns
from .llama import HandLlama, LlamaGPT
from .nanochat import ChatGPT, nanochat_gpt, rms, rotate
from .patterns import own_patterns
from .runs import TEXT, run_json, text_ids, train_run, train_with_monitor
from .tutorial import CTX, D, HEADS, VOCAB, BatchedGPT, MhaGPT, PerHeadGPT, SdpaGPT, SplitGPT, causal_hidden, tokens

__all__ = ["CTX", "D", "HEADS", "VOCAB", "BatchedGPT", "ChatGPT", "DeltaGPT", "EinsumGPT", "HandEinsumGPT",
           "HandLlama", "LlamaGPT", "MhaGPT", "PerHeadGPT", "SdpaGPT", "SplitGPT", "TEXT", "causal_hidden",
           "hf_config", "hf_model", "hf_pair", "hf_patterns", "nanochat_gpt", "own_patterns", "rms", "rotate",
           "run_json", "text_ids", "tokens", "train_run", "train_with_monitor"]
