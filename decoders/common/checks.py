"""Checks shared by the decoders: hyper-parameters and inputs. Errors raise ``ValueError`` saying what to change.

What lives here: :func:`check_int` (for helpers built outside a decoder's constructor) and
:func:`check_input_ids` (the one input check every decoder's ``generate`` runs first). A decoder's own
settings are checked against their declarations (:mod:`decoders.settings`, :func:`declare.check_args`); the
KV-cache rollback check lives with the cache edits it protects (:func:`decoders.common.kv_cache.check_rollback`).
"""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an integer (not a bool) ``>= minimum``, else raise ``ValueError``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_input_ids(input_ids: Any) -> None:
    """The one input check of every decoder's ``generate``: a 2-D tensor of shape ``(1, prompt_len >= 1)``.

    Args:
        input_ids: what the runner passes, a ``torch.LongTensor`` of shape ``(1, prompt_len)``.

    Raises:
        ValueError: if it is not 2-D, the batch size is not 1 (decoders run the latency setting, one prompt at
            a time) or the prompt is empty (nothing to condition on: a decoder needs at least one prompt token;
            render a non-empty prompt, e.g. with a BOS token or a chat template).
    """
    shape = tuple(getattr(input_ids, "shape", ()))
    if len(shape) != 2:
        raise ValueError(f"input_ids must have shape (1, prompt_len), got shape {shape}")
    if shape[0] != 1:
        raise ValueError(f"batch size must be 1, got {shape[0]} (input_ids shape {shape})")
    if shape[1] == 0:
        raise ValueError("empty prompt: input_ids has shape (1, 0); a decoder needs at least one prompt token "
                         "(render a non-empty prompt, e.g. with a BOS token or a chat template)")
