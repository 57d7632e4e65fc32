"""Statistics of the harness's figures: the two-level bootstrap, Student-t intervals over seeds, Wilson
intervals for rates, and Leviathan et al.'s (2023) model of chain speculative decoding. Pure functions of
numbers (numpy, and pandas for one cell's rows); no column lists (:mod:`harness.rows.columns`), no aggregation
(:mod:`harness.rows.metrics`).

An interval needs enough samples to mean something: below :data:`MIN_INTERVAL_SAMPLES` distinct samples the
harness prints "n too small" instead of a percentile bootstrap's bounds (over 2 problems it gives a 95 %
interval such as [1.64, 1.66] that covers far less than 95 %).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.rows.columns import norm, num

#: Fewest distinct samples (clusters) for which an interval is reported.
MIN_INTERVAL_SAMPLES = 5


def bootstrap_weights(clusters: Sequence[Any], n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """Two-level bootstrap weights: ``W[b, i]`` = how often observation ``i`` is drawn in resample ``b``.

    Each resample draws as many clusters (samples) as there are, with replacement, and within each drawn
    cluster as many of its observations (repeats, turns, runs) as it has, with replacement. Statistics are
    then weighted sums (``W @ x``). With one observation per cluster this is the ordinary bootstrap.

    Args:
        clusters: cluster id of each observation (length N).
        n_boot: resamples B.
        seed: RNG seed (the weights are reproducible).

    Returns:
        float64 array of shape (B, N).
    """
    codes, uniq = pd.factorize(pd.Series(list(clusters), dtype=object))
    n_obs, n_cl = len(codes), len(uniq)
    rng = np.random.default_rng(seed)
    w = np.zeros((n_boot, n_obs))
    if n_obs == 0:
        return w
    counts = rng.multinomial(n_cl, np.full(n_cl, 1.0 / n_cl), size=n_boot)  # (B, clusters)
    for c in range(n_cl):
        idx = np.flatnonzero(codes == c)
        if len(idx) == 1:
            w[:, idx[0]] = counts[:, c]
        else:
            w[:, idx] = rng.multinomial(counts[:, c] * len(idx), np.full(len(idx), 1.0 / len(idx)))
    return w


def interval(draws: np.ndarray, level: float) -> tuple[float, float, float]:
    """Percentile interval ``(low, high)`` at ``level`` and standard error of bootstrap ``draws`` (non-finite
    draws left out; NaNs with fewer than two)."""
    d = draws[np.isfinite(draws)]
    if len(d) < 2:
        return math.nan, math.nan, math.nan
    a = (1.0 - level) / 2.0
    return float(np.quantile(d, a)), float(np.quantile(d, 1.0 - a)), float(d.std(ddof=1))


def bootstrap_mean_ci(values: Sequence[float], n_boot: int = 2000, level: float = 0.95, seed: int = 0,
                      clusters: Sequence[Any] | None = None) -> dict[str, float]:
    """Mean of ``values`` with a percentile bootstrap interval (two-level when ``clusters`` is given).

    Returns:
        ``{"mean", "low", "high", "std"}``; ``std`` is the bootstrap standard error. With fewer than two
        values (or one cluster) the interval and std are NaN.
    """
    x = np.asarray([np.nan if v is None else v for v in values], dtype=float)
    cl = list(range(len(x))) if clusters is None else list(clusters)
    keep = ~np.isnan(x)
    x, cl = x[keep], [c for c, k in zip(cl, keep) if k]
    if len(x) == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "std": math.nan}
    mean = float(x.mean())
    if len(x) < 2 or len(set(cl)) < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "std": math.nan}
    w = bootstrap_weights(cl, n_boot, seed)
    lo, hi, sd = interval((w @ x) / w.sum(axis=1), level)
    return {"mean": mean, "low": lo, "high": hi, "std": sd}


def expected_accept_length(alpha: float, gamma: float) -> float:
    """Leviathan et al. 2023, eq. 1: E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha) (gamma + 1 at alpha=1)."""
    if alpha is None or gamma is None or math.isnan(alpha) or math.isnan(gamma):
        return math.nan
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def theory_speedup(alpha: float, gamma: float, cost_ratio: float) -> float:
    """Leviathan et al. 2023 (Thm 3.8): S = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    Assumes i.i.d. acceptance with probability ``alpha`` and that verifying gamma+1 tokens costs one target
    step. Worked numbers (docs/measurement.md, Metric definitions, theory): alpha=0.8, gamma=4, c=0.1 -> 2.40.
    """
    if cost_ratio is None or math.isnan(cost_ratio):
        return math.nan
    return expected_accept_length(alpha, gamma) / (gamma * cost_ratio + 1.0)


def t_quantile(p: float, dof: int) -> float:
    """Quantile ``p`` (0.5 < p < 1) of Student's t distribution with ``dof`` degrees of freedom, by bisection
    on its CDF (Simpson's rule over the density; |error| < 1e-6 for the quantiles used here).

    Example: ``t_quantile(0.975, 2)`` is 4.303, ``t_quantile(0.975, 1)`` is 12.706.
    """
    if not 0.5 < p < 1 or dof < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and dof >= 1, got p={p}, dof={dof}")
    c = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)

    def cdf(t: float) -> float:
        x = np.linspace(0.0, t, 4001)
        y = c * (1.0 + x * x / dof) ** (-(dof + 1) / 2)
        h = t / 4000
        return 0.5 + h / 3 * (y[0] + y[-1] + 4 * y[1:-1:2].sum() + 2 * y[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def seed_interval(g: pd.DataFrame, column: str, level: float = 0.95) -> dict[str, float]:
    """A quality column of one cell over sampling seeds: each seed's mean over its rows, then their mean,
    standard deviation and Student-t interval (``seeds - 1`` degrees of freedom).

    Args:
        g: the cell's ok rows, with ``column`` and ``sampling_seed``.

    Returns:
        ``{"mean", "low", "high", "seed_std", "seeds"}`` (for a column whose values all lie in [0, 1], such as
        pass@1, accuracy or ROUGE, the interval is clipped to [0, 1]); with fewer than two seeds the mean is over rows and the
        rest NaN (``seeds`` counts the distinct non-null seeds).
    """
    x = num(g[column])
    seeds = g["sampling_seed"].map(norm) if "sampling_seed" in g else pd.Series([None] * len(g), index=g.index)
    keep = x.notna() & seeds.notna()
    per_seed = x[keep].groupby(seeds[keep].astype(str), sort=False).mean()
    n = len(per_seed)
    if n < 2:
        return {"mean": float(x.mean()) if x.notna().any() else math.nan, "low": math.nan, "high": math.nan,
                "seed_std": math.nan, "seeds": n}
    mean, sd = float(per_seed.mean()), float(per_seed.std(ddof=1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    if x[keep].between(0.0, 1.0).all():  # a rate or a ROUGE score: the interval stays inside [0, 1]
        low, high = max(low, 0.0), min(high, 1.0)
    return {"mean": mean, "low": low, "high": high, "seed_std": sd, "seeds": n}


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a rate (pass@1, accuracy) from ``successes`` of ``n`` samples; better than a
    normal or bootstrap interval at small n and at rates near 0 or 1 (Wilson 1927). ``(nan, nan)`` when
    ``n < MIN_INTERVAL_SAMPLES``.

    Example: 9 of 10 -> (0.596, 0.982).
    """
    if n < MIN_INTERVAL_SAMPLES:
        return math.nan, math.nan
    z = _normal_quantile(1.0 - (1.0 - level) / 2.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _normal_quantile(p: float) -> float:
    """Quantile of the standard normal distribution (bisection on ``erf``; |error| < 1e-9)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p else (lo, mid)
    return (lo + hi) / 2
