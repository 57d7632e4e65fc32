"""Hyper-parameter checks shared by the decoders: config errors raise ``ValueError`` saying what to change."""

from __future__ import annotations

#: Lifetimes of an n-gram / phrase pool: ``sample`` = cold start (fresh per prompt), ``task`` = warm start.
POOL_SCOPES = ("sample", "task")


def check_int(name: str, value: object, minimum: int) -> int:
    """Return ``value`` if it is an integer (not a bool) ``>= minimum``, else raise ``ValueError``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_pool_scope(pool_scope: object) -> str:
    """Return ``pool_scope`` if it is one of :data:`POOL_SCOPES`, else raise ``ValueError``."""
    if pool_scope not in POOL_SCOPES:
        raise ValueError(f"pool_scope must be one of {POOL_SCOPES}, got {pool_scope!r}")
    return pool_scope  # type: ignore[return-value]
