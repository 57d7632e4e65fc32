"""The one stop rule shared by every decoder: ``max_new_tokens`` and end-of-sequence ids."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

#: End-of-turn / end-of-text tokens that stop generation whenever the vocabulary has them. The Qwen2.5
#: GGUF files name only ``<|im_end|>`` as EOS, yet ``<|endoftext|>`` also ends a reply (upstream
#: ``generation_config.json`` lists both).
KNOWN_END_TOKENS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "</s>")


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def collect_eos_token_ids(tokenizer: Any, *generation_configs: Any) -> frozenset[int]:
    """Every id that ends generation: the tokenizer's EOS, each generation config's ``eos_token_id``
    (int or list), and any of :data:`KNOWN_END_TOKENS` that the vocabulary holds."""
    ids = set(_as_list(getattr(tokenizer, "eos_token_id", None)))
    for gc in generation_configs:
        if gc is not None:
            ids.update(_as_list(getattr(gc, "eos_token_id", None)))
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in KNOWN_END_TOKENS if t in vocab)
    return frozenset(ids)


def truncate_at_stop(tokens: Sequence[int], eos_token_ids: Iterable[int], max_new_tokens: int) -> list[int]:
    """Cut ``tokens`` to at most ``max_new_tokens`` and just after the first EOS id (which is kept)."""
    eos = set(eos_token_ids)
    out = list(tokens[:max_new_tokens])
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1]
    return out


def check_max_new_tokens(max_new_tokens: int) -> None:
    """Raise ``ValueError`` unless ``max_new_tokens >= 1``."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
