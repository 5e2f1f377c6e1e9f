"""posym.core.stats: the correlations every command shares (the intervals are tested where they are used)."""

import math

import numpy as np
import pandas as pd
import pytest

from posym.core.stats import auroc, auroc_interval, pearson, seed_interval, spearman, t_cdf, t_quantile, welch_test


def test_spearman_is_the_classic_formula_without_ties_and_averages_tied_ranks():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=50)
    d = np.argsort(np.argsort(x)) - np.argsort(np.argsort(y))  # rank differences, no ties
    assert spearman(x, y) == pytest.approx(1 - 6 * (d**2).sum() / (50 * (50**2 - 1)), abs=1e-12)
    # ties: ranks [1.5, 1.5, 3, 4] against [1, 2, 3, 4]: Pearson of those, by hand
    a, b = np.array([1.5, 1.5, 3, 4]), np.array([1, 2, 3, 4.0])
    assert spearman([7, 7, 8, 9], [1, 2, 3, 4]) == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == -1.0


def test_a_constant_side_has_no_correlation():
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3])) and math.isnan(pearson(pd.Series([2, 2]), pd.Series([1, 2])))
    assert pearson(pd.Series([1.0, 2, 3]), pd.Series([2.0, 4, 6])) == 1.0


def test_t_distribution_agrees_with_mpmaths_incomplete_beta():
    """t_cdf against mpmath's regularized incomplete beta (arbitrary precision) at whole and fractional df, both
    tails; t_quantile inverts it; the seeds' interval and Welch's test written out."""
    mpmath = pytest.importorskip("mpmath")
    for df in (1.0, 2.0, 2.5, 4.0, 7.3, 30.0, 200.0):
        for t in (-9.0, -3.1, -0.4, 0.0, 0.7, 2.2, 9.0):
            tail = mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True) / 2  # P(T > |t|)
            reference = float(1 - tail if t > 0 else tail)
            assert t_cdf(t, df) == pytest.approx(reference, abs=1e-12)
        for p in (0.025, 0.5, 0.975, 0.999):
            assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-10)
    values = [0.62, 0.64, 0.57, 0.62, 0.60]
    mean, sd, lo, hi = seed_interval(values)
    assert sd == pytest.approx(float(np.std(values, ddof=1)), abs=1e-15)
    assert hi - mean == pytest.approx(mean - lo) and hi - mean == pytest.approx(2.7764451051977934 * sd / math.sqrt(5))
    assert math.isnan(seed_interval([0.5])[1])
    a, b = [0.77, 0.67, 0.66, 0.64, 0.58], [0.62, 0.64, 0.57, 0.62, 0.60]
    t, df, p = welch_test(a, b)
    va, vb = np.var(a, ddof=1) / 5, np.var(b, ddof=1) / 5
    assert t == pytest.approx((np.mean(a) - np.mean(b)) / math.sqrt(va + vb))
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 4 + vb**2 / 4))
    assert p == pytest.approx(2 * t_cdf(-abs(t), df)) and 0 < p < 1
    assert all(math.isnan(v) for v in welch_test([1.0], b))


def test_auroc_against_counting_pairs():
    gen = np.random.default_rng(0)
    scores = gen.integers(0, 5, size=30).astype(float)  # ties on purpose
    positive = gen.random(30) < 0.3
    pairs = [(1.0 if a > b else 0.5 if a == b else 0.0) for a in scores[positive] for b in scores[~positive]]
    assert auroc(scores, positive) == pytest.approx(np.mean(pairs), abs=1e-12)
    assert auroc(np.arange(4.0), np.array([False, False, True, True])) == 1.0
    assert math.isnan(auroc(np.arange(3.0), np.zeros(3, bool)))
    lo, hi = auroc_interval(scores, positive, draws=200)
    assert lo <= auroc(scores, positive) <= hi
    # layer-matched: only pairs inside one layer; a score that is the layer itself gets exactly 0.5
    layers = gen.integers(0, 3, size=30)
    inside = [
        (1.0 if a > b else 0.5 if a == b else 0.0)
        for i in np.flatnonzero(positive)
        for j in np.flatnonzero(~positive)
        if layers[i] == layers[j]
        for a, b in [(scores[i], scores[j])]
    ]
    assert auroc(scores, positive, layers) == pytest.approx(np.mean(inside), abs=1e-12)
    assert auroc(layers.astype(float), positive, layers) == 0.5
