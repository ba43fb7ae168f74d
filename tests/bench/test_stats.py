"""The percentile maths of bench/stats.py against known distributions and a reference."""

from __future__ import annotations

import math
import random

import pytest
from bench.stats import median, percentile, percentiles, spread


def reference(values: list[float], p: float) -> float:
    """numpy's default ('linear') percentile, written out the slow, obvious way."""
    s = sorted(values)
    pos = (len(s) - 1) * p / 100
    below = int(pos)
    if below == len(s) - 1:
        return s[below]
    return s[below] * (1 - (pos - below)) + s[below + 1] * (pos - below)


def test_uniform_1_to_100() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 0) == 1
    assert percentile(xs, 100) == 100
    assert percentile(xs, 50) == pytest.approx(50.5)
    assert percentile(xs, 90) == pytest.approx(90.1)
    assert percentile(xs, 99) == pytest.approx(99.01)


def test_known_small_samples() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 25) == pytest.approx(1.75)  # numpy gives 1.75
    assert math.isnan(percentile([], 50))


@pytest.mark.parametrize("seed", range(5))
def test_matches_reference_on_random_samples(seed: int) -> None:
    rng = random.Random(seed)
    xs = [rng.expovariate(1.0) for _ in range(rng.randint(1, 500))]
    for p in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(sorted(xs), p) == pytest.approx(reference(xs, p))


def test_exponential_distribution_quantiles() -> None:
    # For Exp(1) the p-quantile is -ln(1 - p); a large sample lands close to it.
    rng = random.Random(42)
    xs = [rng.expovariate(1.0) for _ in range(40_000)]
    got = percentiles(xs)
    assert got["p50"] == pytest.approx(math.log(2), rel=0.03)
    assert got["p90"] == pytest.approx(-math.log(0.1), rel=0.03)
    assert got["p99"] == pytest.approx(-math.log(0.01), rel=0.08)


def test_percentiles_keys_and_unsorted_input() -> None:
    assert percentiles([3.0, 1.0, 2.0]) == {
        "p50": 2.0,
        "p90": pytest.approx(2.8),
        "p99": pytest.approx(2.98),
    }
    assert median([9.0, 1.0, 5.0]) == 5.0


def test_out_of_range_percentile_is_refused() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_spread_skips_nan_and_reports_min_max() -> None:
    assert spread([3.0, math.nan, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert all(math.isnan(v) for v in spread([math.nan]).values())
