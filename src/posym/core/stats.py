"""Intervals for behavioural numbers on prompts: binomial (Wilson) and the paired prompt bootstrap.

Every behavioural number posym reports on prompts carries its n and a 95% interval. Accuracies get
the Wilson score interval (exact enough at n >= 10 and never outside [0, 1], unlike the normal
approximation at accuracies near 0 or 1). Statistics that are functions of several per-prompt tables
measured on the SAME prompts (a retention = mean at length L / mean at the base length; a drop under
ablation = accuracy clean - accuracy ablated) get the paired bootstrap: resample prompts with
replacement, recompute the statistic on every table with the same resampled prompts, take the 2.5 and
97.5 percentiles.

>>> lo, hi = wilson_interval(18, 20)
>>> round(lo, 3), round(hi, 3)
(0.699, 0.972)
>>> weights = bootstrap_weights(4, 3, seed=0)  # [draws, prompts]: how often each prompt is drawn
>>> weights.shape, weights.sum(axis=1).tolist()
((3, 4), [4.0, 4.0, 4.0])
"""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile: two-sided 95% intervals."""
N_BOOT = 1000
"""Bootstrap draws of every interval unless a caller says otherwise."""


def pearson(x, y) -> float:
    """Pearson r of two pandas Series; NaN when either is constant.

    >>> import pandas as pd
    >>> pearson(pd.Series([1, 2, 3]), pd.Series([2, 4, 7])) > 0.99, pearson(pd.Series([1, 1]), pd.Series([1, 2]))
    (True, nan)
    """
    return float("nan") if x.nunique() < 2 or y.nunique() < 2 else float(x.corr(y))


def spearman(x, y) -> float:
    """Spearman rho of two equal-length arrays: `pearson` of their ranks (average ranks for ties).

    >>> round(spearman([1, 2, 3, 4], [10, 20, 40, 30]), 6)
    0.8
    """
    import pandas as pd

    return pearson(pd.Series(x, dtype=float).rank(), pd.Series(y, dtype=float).rank())


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion successes / n (NaNs when n = 0)."""
    if n <= 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at 0 and n successes the bounds are exactly 0 and 1 (the formula gives them up to rounding)
    return (0.0 if successes == 0 else max(0.0, centre - half)), (1.0 if successes == n else min(1.0, centre + half))


def bootstrap_weights(n: int, draws: int = N_BOOT, seed: int = 0):
    """Resampling weights [draws, n] (float64): row b counts how often each of the n prompts is drawn
    in bootstrap sample b, so `weights @ values / n` is every bootstrap mean at once."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=draws).astype(np.float64)  # [B, n]


def percentile_interval(samples, axis: int = 0) -> tuple:
    """(2.5%, 97.5%) percentiles of bootstrap samples along `axis`, NaN-aware."""
    with np.errstate(all="ignore"):
        return np.nanpercentile(samples, 2.5, axis=axis), np.nanpercentile(samples, 97.5, axis=axis)


# ---- tests: randomization p, Holm, McNemar, power ---------------------------------------------------

ALPHA = 0.05
"""Family-wise error rate of every Holm-corrected verdict."""
POWER = 0.8
"""Power at which a minimal detectable effect or a needed prompt count is stated."""


def normal_quantile(p: float) -> float:
    """The standard normal's p-quantile (stdlib `statistics.NormalDist`).

    >>> round(normal_quantile(0.975), 4), round(normal_quantile(0.8), 4)
    (1.96, 0.8416)
    """
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def randomization_p(observed: float, null) -> float:
    """Two-sided randomization p of a statistic against its null draws (random head sets):
    (1 + #draws at least as far from the null's median as the observation) / (draws + 1). Draws that
    are NaN are left out; NaN when the observation is NaN or no draw is left. With D draws the
    smallest p it can give is 1 / (D + 1): 10 draws can never go below 0.091.

    >>> randomization_p(5.0, [0.0, 1.0, -1.0, 2.0]), randomization_p(0.0, [0.0, 1.0, -1.0])
    (0.2, 1.0)
    """
    null = np.asarray(null, dtype=np.float64)
    null = null[~np.isnan(null)]
    if not math.isfinite(observed) or null.size == 0:
        return float("nan")
    centre = float(np.median(null))
    extreme = int(np.sum(np.abs(null - centre) >= abs(observed - centre) - 1e-12))
    return (1 + extreme) / (null.size + 1)


def holm_floor(tests: int, draws: int) -> float:
    """The smallest Holm-adjusted p a family of `tests` randomization tests can give over `draws` null draws
    each: Holm multiplies the smallest p, at least 1 / (draws + 1), by the family's size.

    >>> holm_floor(18, 100), holm_floor(3, 100) < 0.05 < holm_floor(18, 100)
    (0.1782178217821782, True)
    """
    return min(1.0, tests / (draws + 1))


def draws_for_holm(tests: int, alpha: float = ALPHA) -> int:
    """The fewest null draws at which a family of `tests` randomization tests can pass Holm at `alpha`
    (`holm_floor` <= alpha): a policy above every draw in every test is then a verdict.

    >>> draws_for_holm(18), draws_for_holm(3), holm_floor(18, draws_for_holm(18)) <= 0.05
    (359, 59, True)
    """
    return max(1, math.ceil(round(tests / alpha, 9)) - 1)


def holm(pvalues) -> np.ndarray:
    """Holm-adjusted p-values (step-down, monotone, capped at 1) of one family of tests; NaN entries
    are not tests (they keep NaN and do not count in the family's size).

    >>> holm([0.01, 0.04, 0.03, float("nan")]).round(3).tolist()
    [0.03, 0.06, 0.06, nan]
    """
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    real = np.flatnonzero(~np.isnan(p))
    m = real.size
    running = 0.0
    for rank, i in enumerate(real[np.argsort(p[real], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p of paired binary outcomes: b pairs right only in the first condition,
    c only in the second (a binomial test of b against b + c trials at 1/2); 1.0 with no discordant pair.

    >>> round(mcnemar_p(10, 2), 4), mcnemar_p(0, 0)
    (0.0386, 1.0)
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def detectable_effect(sd: float, n: int, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimal detectable effect of a paired comparison of n prompts whose per-prompt differences have
    standard deviation sd (ddof 1): (z_{1-alpha/2} + z_power) * sd / sqrt(n), normal approximation.

    >>> round(detectable_effect(0.5, 49), 3)
    0.2
    """
    if n < 2 or not math.isfinite(sd):
        return float("nan")
    return (normal_quantile(1 - alpha / 2) + normal_quantile(power)) * sd / math.sqrt(n)


def prompts_for_effect(sd: float, effect: float, *, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Prompts a paired comparison needs to detect `effect` with the given power at level alpha, when
    its per-prompt differences have standard deviation sd: ((z_{1-alpha/2} + z_power) * sd / effect)^2,
    at least 2. None when sd is not finite.

    >>> prompts_for_effect(0.5, 0.2)
    50
    """
    if not math.isfinite(sd) or not effect:
        return None
    z = normal_quantile(1 - alpha / 2) + normal_quantile(power)
    return max(2, math.ceil((z * sd / abs(effect)) ** 2 - 1e-9))


# ---- over seeds: Student's t ---------------------------------------------------------------------


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Lentz's continued fraction, Numerical Recipes 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast below this point: use the symmetry
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom.

    >>> round(t_cdf(2.0, 10), 6), t_cdf(0.0, 3)
    (0.963306, 0.5)
    """
    if t * t < df:  # x = df / (df + t^2) near 1: pass the small complement itself (1 - x loses digits)
        tail = 0.5 * (1.0 - _incomplete_beta(0.5, df / 2.0, t * t / (df + t * t)))  # P(T > |t|)
    else:
        tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with t_cdf(t, df) = p (bisection to 1e-12).

    >>> round(t_quantile(0.975, 2), 6), round(t_quantile(0.975, 4), 6)
    (4.302653, 2.776445)
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, abs(hi)):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


def seed_interval(values, level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, sd with ddof 1, lo, hi) of values over seeds: the t interval mean +- t_{(1+level)/2, n-1} sd / sqrt(n)
    (nan sd and interval for a single value).

    >>> [round(v, 4) for v in seed_interval([0.6, 0.7, 0.8])]
    [0.7, 0.1, 0.4516, 0.9484]
    """
    x = np.asarray(values, dtype=np.float64)
    x = x[~np.isnan(x)]
    mean = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return mean, math.nan, math.nan, math.nan
    sd = float(x.std(ddof=1))
    half = t_quantile((1.0 + level) / 2.0, len(x) - 1) * sd / math.sqrt(len(x))
    return mean, sd, mean - half, mean + half


def welch_test(a, b) -> tuple[float, float, float]:
    """Welch's two-sample t test of mean(a) - mean(b): (t, Welch-Satterthwaite df, two-sided p); nan when either
    sample has fewer than two values or both have no spread.

    >>> [round(v, 4) for v in welch_test([1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0])]
    [-2.1909, 6.0, 0.071]
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan, math.nan
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return math.nan, math.nan, math.nan
    t = float((a.mean() - b.mean()) / math.sqrt(va + vb))
    df = float((va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)))
    return t, df, 2.0 * t_cdf(-abs(t), df)


def auroc(scores, positive, strata=None) -> float:
    """Area under the ROC curve of `scores` for telling `positive` (bool) heads from the rest: the
    probability that a random positive outscores a random negative, ties counting one half
    (Mann-Whitney U / (n+ n-)); NaN without positives or negatives. strata (e.g. each head's layer):
    only pairs inside one stratum count (a layer-matched AUROC: depth alone cannot score above 0.5)."""
    import pandas as pd

    scores, positive = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    strata = np.zeros(len(scores)) if strata is None else np.asarray(strata)
    u, pairs = 0.0, 0
    for stratum in np.unique(strata):
        inside = strata == stratum
        s, p = scores[inside], positive[inside]
        n_pos, n_neg = int(p.sum()), int((~p).sum())
        if n_pos and n_neg:
            ranks = pd.Series(s).rank().to_numpy()  # 1..n, ties sharing their average (counting one half in U)
            u += ranks[p].sum() - n_pos * (n_pos + 1) / 2
            pairs += n_pos * n_neg
    return float(u / pairs) if pairs else float("nan")


def auroc_interval(scores, positive, strata=None, draws: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of `auroc` under resampling the heads with replacement (seeded)."""
    scores, positive = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    strata = np.zeros(len(scores)) if strata is None else np.asarray(strata)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(scores), size=(draws, len(scores)))  # [draws, heads]
    values = np.array([auroc(scores[p], positive[p], strata[p]) for p in picks])
    values = values[~np.isnan(values)]
    if not len(values):
        return float("nan"), float("nan")
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))
