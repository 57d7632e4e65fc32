"""Checks shared by the decoders: hyper-parameters and inputs. Errors raise ``ValueError`` saying what to change.

What lives here: integer / pool-scope hyper-parameter checks and :func:`check_input_ids` (the one input
check every decoder's ``generate`` runs first). The KV-cache rollback check lives with the cache edits it
protects (:func:`decoders.common.kv_cache.check_rollback`).
"""

from __future__ import annotations

from typing import Any

#: Lifetimes of an n-gram / phrase pool: ``sample`` = cold start (fresh per prompt), ``task`` = warm start.
POOL_SCOPES = ("sample", "task")


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an integer (not a bool) ``>= minimum``, else raise ``ValueError``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_fraction(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a number in ``[0, 1]`` (not a bool), else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number between 0 and 1 (0 = off), got {value!r}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool, else raise ``ValueError``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_pool_scope(pool_scope: object) -> str:
    """Return ``pool_scope`` if it is one of :data:`POOL_SCOPES`, else raise ``ValueError``."""
    if pool_scope not in POOL_SCOPES:
        raise ValueError(f"pool_scope must be one of {POOL_SCOPES}, got {pool_scope!r}")
    return pool_scope  # type: ignore[return-value]


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
