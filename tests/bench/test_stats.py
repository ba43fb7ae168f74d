"""The percentile maths of bench/stats.py against known distributions and a reference."""

from __future__ import annotations

import math
import random

import pytest
from bench.stats import bootstrap_ratio, median, percentile, percentiles, ratio_of_medians, spread


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


def test_ratio_of_medians_divides_the_two_sides_medians() -> None:
    assert ratio_of_medians([(10.0, 20.0), (30.0, 40.0), (50.0, 60.0)]) == pytest.approx(0.75)
    assert math.isnan(ratio_of_medians([]))
    assert math.isnan(ratio_of_medians([(1.0, 0.0)]))


def _run(rng: random.Random, ratio: float, rounds: int, noise: float = 0.08) -> list[tuple[float, float]]:
    """A run's (keyed, plain) req/s: plain moves round to round, keyed is `ratio` of it, each
    with its own noise."""
    out = []
    for _ in range(rounds):
        plain = 15_000 * rng.uniform(0.8, 1.2)
        out.append((ratio * plain * rng.gauss(1, noise), plain * rng.gauss(1, noise)))
    return out


def test_bootstrap_interval_holds_the_ratio_and_narrows_with_more_rounds() -> None:
    rng = random.Random(7)
    short = bootstrap_ratio([_run(rng, 0.93, 15)])
    long = bootstrap_ratio([_run(rng, 0.93, 240)])
    assert short[0] < 0.93 < short[1]
    assert long[0] < 0.93 < long[1]
    assert long[1] - long[0] < (short[1] - short[0]) / 2


def test_bootstrap_is_seeded_and_a_point_when_every_pair_is_the_same() -> None:
    pairs = _run(random.Random(1), 0.9, 20)
    assert bootstrap_ratio([pairs], seed=3) == bootstrap_ratio([pairs], seed=3)
    lo, hi = bootstrap_ratio([[(9.0, 10.0)] * 12])
    assert lo == pytest.approx(0.9) and hi == pytest.approx(0.9)
    assert all(math.isnan(x) for x in bootstrap_ratio([]))
    assert all(math.isnan(x) for x in bootstrap_ratio([[], []]))
    with pytest.raises(ValueError, match="level"):
        bootstrap_ratio([pairs], level=95)


def test_bootstrap_keeps_what_moves_a_whole_run_in_the_interval() -> None:
    # Two runs that disagree (0.82 and 0.98) with little noise inside each: pooling their
    # rounds as one sample would give a narrow interval around 0.9 that neither run saw;
    # drawing the runs first says the ratio is somewhere between them.
    rng = random.Random(11)
    runs = [_run(rng, 0.82, 60, noise=0.01), _run(rng, 0.98, 60, noise=0.01)]
    lo, hi = bootstrap_ratio(runs)
    assert lo < 0.83 and hi > 0.97
    flat_lo, flat_hi = bootstrap_ratio([runs[0] + runs[1]])
    assert flat_lo > 0.83 and flat_hi < 0.97
