"""KV-cache edits: rollback (crop) and compaction of an accepted tree path (``keep_path``).

Both act on a transformers :class:`~transformers.DynamicCache` whose layers store keys and values of
shape ``(batch_size, num_kv_heads, seq_len, head_dim)``. Caches that cannot be edited (sliding-window,
quantized, linear-attention layers) are refused with a ``TypeError`` rather than silently corrupted.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import DynamicCache


def _editable(layer: Any) -> bool:
    """Whether a cache layer can be cropped and compacted: a full-attention, croppable layer."""
    return bool(getattr(layer, "is_croppable", False)) and not getattr(layer, "is_sliding", False)


def _check_editable(cache: DynamicCache) -> None:
    for layer in cache.layers:
        if not _editable(layer):
            raise TypeError(
                f"KV cache layer {type(layer).__name__} cannot be rolled back; speculative decoders need "
                "full-attention DynamicCache layers (no sliding window, no quantized cache)."
            )


def check_rollback(model: Any, role: str, decoder: str) -> None:
    """Refuse, at construction, a model whose KV cache cannot be rolled back (edge inputs).

    Every decoder that rejects draft tokens removes their KV entries (:func:`crop`, :func:`keep_path`). The
    layers of the model's own ``DynamicCache`` (built from its config, as :func:`decoders.common.forward.new_cache`
    does) tell whether that is possible: sliding-window layers keep only the last ``sliding_window - 1``
    entries and track their length separately, quantized and linear-attention (recurrent) layers cannot drop
    entries. Such a model would fail mid-run with a tensor-size error; this check fails before any sample.

    Args:
        model: a transformers causal LM.
        role: ``"target model"`` or ``"draft model"``, for the message.
        decoder: the decoder's name, for the message.

    Raises:
        ValueError: naming the model, the first offending layer and why.
    """
    cache = DynamicCache(config=model.config)
    name = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or \
        f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"
    for i, layer in enumerate(cache.layers):
        if _editable(layer):
            continue
        if getattr(layer, "is_sliding", False):
            why = (f"layer {i} uses sliding-window attention (window {getattr(layer, 'sliding_window', '?')} tokens), "
                   "whose cache keeps only the last window of entries and cannot drop rejected draft tokens")
        else:
            why = f"layer {i}'s cache ({type(layer).__name__}) cannot be cropped (quantized or recurrent state)"
        raise ValueError(
            f"the {decoder} decoder rolls back its KV cache after rejected drafts, but the {role} {name!r} cannot "
            f"be rolled back: {why}. Use a model with full attention in every layer (e.g. Qwen2 with "
            "use_sliding_window=false), or a decoder that never rolls back (vanilla, hf_assisted)."
        )


def crop(cache: DynamicCache, length: int) -> None:
    """Drop every KV entry at positions ``>= length`` (rollback of rejected tokens).

    Args:
        cache: the cache to edit in place.
        length: number of entries to keep; must be ``<=`` the current length.

    Raises:
        ValueError: if ``length`` is negative or longer than the cache.
    """
    current = cache.get_seq_length()
    if not 0 <= length <= current:
        raise ValueError(f"cannot crop a KV cache of length {current} to {length}")
    if length < current:
        _check_editable(cache)
        cache.crop(length - current)  # transformers 5.x: a negative count of entries to remove


def keep_path(cache: DynamicCache, start: int, kept_positions: Sequence[int] | torch.Tensor) -> None:
    """Keep ``cache[:start]`` followed by the entries at ``kept_positions``; drop everything else.

    Tree and lookahead verification write KV entries for every candidate token; after verification
    only the accepted path survives, moved down to sit right after ``start``.

    Example:
        The cache holds 10 committed entries, then a 6-token tree ``[a, b1, b2, c1, c2, d]`` at
        positions 10..15. If the accepted path is ``a, b2, c2``, then
        ``keep_path(cache, 10, [10, 12, 14])`` leaves 13 entries: the first 10, then a, b2, c2.

    Args:
        cache: the cache to edit in place.
        start: entries before this index are kept as they are.
        kept_positions: increasing absolute indices ``>= start`` to keep, in order.

    Raises:
        ValueError: if an index is out of range or the indices do not increase.
    """
    length = cache.get_seq_length()
    # Checked in plain Python: a path holds a handful of ints, and each tensor op would cost more than the check.
    kept = kept_positions.tolist() if torch.is_tensor(kept_positions) else [int(k) for k in kept_positions]
    if kept and (kept[0] < start or kept[-1] >= length or any(b <= a for a, b in zip(kept, kept[1:]))):
        raise ValueError(f"kept_positions must increase within [{start}, {length}); got {kept}")
    # The leading part of the path already in place stays; only the entries after it move, in place (a gather of
    # the moved entries, written over the rows right after the part in place), then the cache is cropped (a view).
    # The whole cache is never copied: a tree step costs O(path), not O(context) per layer.
    first = next((i for i, k in enumerate(kept) if k != start + i), len(kept))
    crop_to = start + len(kept)
    if first < len(kept):
        _check_editable(cache)
        dst = slice(start + first, crop_to)
        on: dict[torch.device, torch.Tensor] = {}  # the positions copied once per device, not once per layer
        with torch.inference_mode():  # caches filled under inference mode can be written in place only there
            for layer in cache.layers:
                dev = layer.keys.device
                idx = on[dev] if dev in on else on.setdefault(
                    dev, torch.tensor(kept[first:], dtype=torch.long, device=dev))
                layer.keys[..., dst, :] = layer.keys.index_select(-2, idx)
                layer.values[..., dst, :] = layer.values.index_select(-2, idx)
    crop(cache, crop_to)
