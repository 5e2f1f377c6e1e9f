"""posym.core.stats: the correlations every command shares (the intervals are tested where they are used)."""

import math

import numpy as np
import pandas as pd
import pytest

from posym.core.stats import pearson, spearman


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
