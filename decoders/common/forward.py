"""The single forward helper through which every decoder drives a stock transformers causal LM.

Vanilla, speculative and every tree decoder call :func:`forward`, so a measured speedup compares
algorithms, not two code paths. Only public inputs of the stock model are used: ``input_ids``,
``position_ids``, ``attention_mask`` (none for a plain causal continuation, or a 4-D additive mask for
tree / lookahead layouts), and ``cache`` (the KV cache keyword of transformers 5.x). No transformers code is patched.
"""

from __future__ import annotations

import sys

import torch
from transformers import DynamicCache, PreTrainedModel


def max_depth_after(model: PreTrainedModel, position: int) -> int:
    """How far past ``position`` a tree token may sit without exceeding ``max_position_embeddings`` (``sys.maxsize``
    for a model without that limit)."""
    max_pos = getattr(model.config, "max_position_embeddings", None)
    return max_pos - 1 - position if max_pos else sys.maxsize


#: One ``(1, length)`` arange per device that :func:`positions` slices (grown by doubling).
_POSITIONS: dict[torch.device, torch.Tensor] = {}


def positions(start: int, n: int, device: torch.device) -> torch.Tensor:
    """The position ids ``start .. start + n - 1`` of a plain continuation, ``torch.LongTensor`` of shape ``(1, n)``
    on ``device``: a view of one cached arange (callers must not write to it), so a decode step builds no index
    tensor for them: one tensor operation instead of two, and right after a forward each costs the host several
    microseconds (on a 2-core Zen 4, ~9 us for the first small op after a forward against ~4 us in a warm loop)."""
    table = _POSITIONS.get(device)
    if table is None or table.shape[1] < start + n:
        with torch.inference_mode(False):  # a normal tensor: callers in and out of inference mode may read it
            table = torch.arange(max(4096, 2 * (start + n)), device=device).unsqueeze(0)
        _POSITIONS[device] = table
    return table[:, start:start + n]


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty dynamic KV cache for ``model``."""
    return DynamicCache(config=model.config)


def forward(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    cache: DynamicCache,
    *,
    position_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    logits_to_keep: int | torch.Tensor = 0,
) -> torch.Tensor:
    """Run ``model`` on new tokens that continue what ``cache`` holds, appending their KV entries, in inference
    mode (entered here only when the caller is not in it already: the decode loops are).

    Args:
        model: a transformers causal LM (Qwen2, Llama, ...), batch size 1.
        input_ids: ``torch.LongTensor`` of shape ``(1, n)``: the new tokens.
        cache: the model's KV cache; its length ``past_len`` grows by ``n``.
        position_ids: ``torch.LongTensor`` of shape ``(1, n)``; defaults to ``past_len .. past_len+n-1``
            (a plain continuation). Tree layouts pass their own (several tokens may share a position).
        attention_mask: ``None`` for a causal continuation, or a 4-D additive float mask of shape
            ``(1, 1, n, past_len + n)`` in the model's dtype (0 = attend, dtype min = masked), as built by
            :mod:`decoders.common.tree`.
        logits_to_keep: if an int > 0, only the last ``logits_to_keep`` positions go through the LM head
            (saves the vocab projection when only the next token is needed); or a ``torch.LongTensor`` of
            shape ``(k,)`` with the indices (into the ``n`` new tokens) whose logits are needed, as tree
            layouts use (transformers' ``slice_logits_to_keep``).

    Returns:
        ``torch.Tensor`` of shape ``(1, n or logits_to_keep or k, vocab_size)`` in the model's dtype.
    """
    if not torch.is_inference_mode_enabled():  # the decode loops run in inference mode: no context per call
        with torch.inference_mode():
            return forward(model, input_ids, cache, position_ids=position_ids, attention_mask=attention_mask,
                           logits_to_keep=logits_to_keep)
    if position_ids is None:
        position_ids = positions(cache.get_seq_length(), input_ids.shape[1], input_ids.device)
    out = model(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        cache=cache,  # transformers >= 5.2x: the KV cache keyword (formerly past_key_values)
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits
