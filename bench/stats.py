"""Percentiles and summaries, without numpy.

Percentiles use linear interpolation between closest ranks, the same definition
as numpy's default (`method="linear"`): p is placed at rank (n - 1) * p / 100 of
the sorted sample and the two neighbours are blended. That keeps our figures
comparable with what other tools (vllm's bench, genai-perf) print.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) of an already sorted sample; NaN when empty."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    n = len(sorted_values)
    if n == 0:
        return math.nan
    rank = (n - 1) * p / 100
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def percentiles(values: Sequence[float], ps: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} of an unsorted sample."""
    s = sorted(values)
    return {f"p{p:g}": percentile(s, p) for p in ps}


def median(values: Sequence[float]) -> float:
    """The median (NaN when empty)."""
    return percentile(sorted(values), 50)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of per-round figures: how a result is reported across rounds."""
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return {"median": math.nan, "min": math.nan, "max": math.nan}
    return {"median": percentile(finite, 50), "min": finite[0], "max": finite[-1]}
