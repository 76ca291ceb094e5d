"""A tiktoken `Encoding` rebuilt as data: the same byte-level BPE in the `tokenizers` library, which a
snapshot saves as `tokenizer.json` (`models.gpt2_bpe.GPT2BPETokenizer`), checked to give tiktoken's
own ids before it is used.

tiktoken keeps ranks (token bytes -> id) and no merge list: a token's merge is found by running BPE
on its bytes with the ranks below its own, which ends on the two parts that made it (tiktoken
merges the adjacent pair whose joined bytes have the lowest rank, so the merges in rank order are
the same rule). A text piece that is itself a token is that token (`ignore_merges`), as in tiktoken.
"""

from __future__ import annotations

from typing import Any

from models.tokenizers import GPT2BPETokenizer

__all__ = ["tiktoken_as_ours"]

CHECK = "Hello, world! It's 2024: naïve café — ok?\n  twice  spaced\tend <|endoftext|>"


def byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what byte-level BPE files store)."""
    kept = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in kept:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def last_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The two parts BPE joins last to make `token`, with only the ranks below its own."""
    limit, parts = ranks[token], [bytes([b]) for b in token]
    while len(parts) > 2:
        joined = [(ranks.get(a + b, limit), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(joined)
        if rank >= limit:
            return None
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def tiktoken_as_ours(encoding: Any) -> GPT2BPETokenizer:
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    name = getattr(encoding, "name", type(encoding).__name__)
    ranks, pattern = getattr(encoding, "_mergeable_ranks", None), getattr(encoding, "_pat_str", None)
    specials = getattr(encoding, "_special_tokens", None) or {}
    if not isinstance(ranks, dict) or not isinstance(pattern, str):
        raise ValueError(f"Monitor: tokenizer= is a tiktoken Encoding ({name}) whose ranks and pattern are not "
                         "readable here: it cannot be saved as data")
    chars = byte_chars()
    text = {token: "".join(chars[b] for b in token) for token in ranks}
    merges = []
    for token in sorted((t for t in ranks if len(t) > 1), key=ranks.__getitem__):
        pair = last_merge(token, ranks)
        if pair is None:
            raise ValueError(f"Monitor: tokenizer= is a tiktoken Encoding ({name}) whose token {token!r} no merge "
                             "of lower-ranked tokens makes: it cannot be saved as byte-pair data")
        merges.append((text[pair[0]], text[pair[1]]))
    backend = Backend(models.BPE(vocab={text[t]: r for t, r in ranks.items()}, merges=merges, ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    for special, _ in sorted(specials.items(), key=lambda kv: kv[1]):
        backend.add_special_tokens([AddedToken(special, special=True)])
    ours = GPT2BPETokenizer(backend)
    wrong = [s for s, i in specials.items() if backend.token_to_id(s) != i]
    check = CHECK if "<|endoftext|>" in specials else CHECK.replace(" <|endoftext|>", "")
    if wrong or ours.encode(check) != encoding.encode(check, allowed_special="all"):
        raise ValueError(f"Monitor: tokenizer= is a tiktoken Encoding ({name}) that rebuilt as data gives other ids "
                         f"({'special token ' + wrong[0] if wrong else 'on a check text'}): it cannot be saved")
    return ours
