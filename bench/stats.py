"""Percentiles and summaries, without numpy.

Percentiles use linear interpolation between closest ranks, the same definition
as numpy's default (`method="linear"`): p is placed at rank (n - 1) * p / 100 of
the sorted sample and the two neighbours are blended. That keeps our figures
comparable with what other tools (vllm's bench, genai-perf) print.
"""

from __future__ import annotations

import math
import random
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


def ratio_spread(pairs: Sequence[tuple[float, float]]) -> dict[str, float]:
    """`spread` of a / b over (a, b) pairs whose b is above 0: each round's own ratio."""
    return spread([a / b for a, b in pairs if b > 0])


def ratio_of_medians(pairs: Sequence[tuple[float, float]]) -> float:
    """median(first) / median(second) of (a, b) pairs; NaN when empty or the second is 0."""
    if not pairs:
        return math.nan
    den = median([b for _, b in pairs])
    return median([a for a, _ in pairs]) / den if den else math.nan


def bootstrap_ratio(
    groups: Sequence[Sequence[tuple[float, float]]],
    level: float = 0.95,
    resamples: int = 4000,
    seed: int = 0,
) -> tuple[float, float]:
    """A `level` percentile-bootstrap interval of `ratio_of_medians` over every pair of `groups`.

    Each group is one run's (a, b) pairs, a and b measured in the same round. Two stages:
    each resample draws as many groups as there are, with replacement, then as many pairs
    from each drawn group as it holds, with replacement. Drawing the runs keeps what moves
    a whole run (the host's state that day, where the scheduler put the threads) in the
    interval, which drawing rounds alone would pool away; with one group it is the plain
    bootstrap of that run's pairs. A pair is never split: the two sides of a round share the
    machine's state. Seeded, so one set of results always gives one interval. (NaN, NaN)
    when there is no pair.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be within 0..1, got {level}")
    groups = [g for g in groups if g]
    if not groups:
        return math.nan, math.nan
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        drawn: list[tuple[float, float]] = []
        for _ in groups:
            g = groups[rng.randrange(len(groups))]
            drawn += [g[rng.randrange(len(g))] for _ in g]
        stats.append(ratio_of_medians(drawn))
    stats.sort()
    tail = (1 - level) / 2 * 100
    return percentile(stats, tail), percentile(stats, 100 - tail)
