"""The scaling fits' bootstrap, made cheap: each resample as its per-size means, all resamples fitted at once.

The least-squares fit of L = E + B·u^-α to every point equals the fit of each size's mean loss weighted by the
size's number of points: Σ over a size's points of (y - f)² is n·(ȳ - f)² plus a term that does not depend on
the parameters. So a resample (units drawn with replacement within each size) is summed into per-size means and
counts, and `fit_many` fits all resamples' means together by Levenberg-Marquardt on arrays (a 3×3 solve per
resample and step). At 100,000 runs × 20 sizes this is a few milliseconds per step instead of one scipy call of
4,000 points per resample; the minimum is the same one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_FTOL = 1e-12  # a step that lowers the weighted squared error by less than this share ends the fit
_XTOL = 1e-10  # a step smaller than this share of every parameter ends it too
_LAMBDA_MAX = 1e16  # damping past this: no step lowers the error from here (a minimum to machine precision)


def resampled_means(y: np.ndarray, units: list[list[np.ndarray]], n: int,
                    seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(means, counts), each n × sizes: per resample and size, the mean loss of the size's units drawn with
    replacement (as many as it has) and the number of points they hold. A unit is an array of point indices."""
    rng = np.random.default_rng(seed)
    sums, counts = np.empty((n, len(units))), np.empty((n, len(units)))
    for j, at in enumerate(units):
        unit_count = np.array([idx.size for idx in at], dtype=float)
        owner = np.repeat(np.arange(len(at)), unit_count.astype(int))  # each point's unit
        unit_sum = np.bincount(owner, weights=y[np.concatenate(at)], minlength=len(at))
        drawn = rng.integers(0, len(at), size=(n, len(at)))
        sums[:, j], counts[:, j] = unit_sum[drawn].sum(axis=1), unit_count[drawn].sum(axis=1)
    return sums / counts, counts


def fit_many(u: np.ndarray, y: np.ndarray, w: np.ndarray, p0: Sequence[float], bounds: Sequence[float],
             iterations: int = 200) -> np.ndarray:
    """(E, B, alpha) minimising Σ w·(y - E - B·u^-alpha)² for each row of y and w (rows: resamples, columns: the
    sizes u), all rows at once by Levenberg-Marquardt from p0. A row that does not converge, or converges
    outside E >= 0, B >= 0, 0 <= alpha <= bounds[2], comes back as NaN (the caller refits it with bounds)."""
    n = y.shape[0]
    params = np.tile(np.asarray(p0, dtype=float), (n, 1))
    cost = _cost(u, y, w, params)
    damping = np.full(n, 1e-3)
    done = np.zeros(n, dtype=bool)
    log_u = np.log(u)
    for _ in range(iterations):
        live = np.flatnonzero(~done & np.isfinite(cost))
        if live.size == 0:
            break
        p, yl, wl = params[live], y[live], w[live]
        power = u ** -p[:, 2:3]
        slope = -p[:, 1:2] * power * log_u  # d/d alpha; d/dE is 1, d/dB is power
        wp, wq = wl * power, wl * slope
        normal = np.empty((live.size, 3, 3))  # J^T W J, by its six sums (einsum's general path is 3x slower)
        normal[:, 0, 0] = wl.sum(1)
        normal[:, 0, 1] = normal[:, 1, 0] = wp.sum(1)
        normal[:, 0, 2] = normal[:, 2, 0] = wq.sum(1)
        normal[:, 1, 1] = (wp * power).sum(1)
        normal[:, 1, 2] = normal[:, 2, 1] = (wp * slope).sum(1)
        normal[:, 2, 2] = (wq * slope).sum(1)
        residual = yl - p[:, :1] - p[:, 1:2] * power
        grad = np.stack([(wl * residual).sum(1), (wp * residual).sum(1), (wq * residual).sum(1)], axis=1)
        diag = np.diagonal(normal, axis1=1, axis2=2)
        damped = normal + np.eye(3) * (damping[live, None] * (diag + 1e-12))[:, None, :]
        try:
            step = np.linalg.solve(damped, grad[..., None])[..., 0]
        except np.linalg.LinAlgError:  # a singular row: leave every live row to the bounded refit
            params[live] = np.nan
            break
        trial = p + step
        trial_cost = _cost(u, yl, wl, trial)
        better = np.isfinite(trial_cost) & (trial_cost <= cost[live])
        small = (np.abs(step) <= _XTOL * (np.abs(p) + _XTOL)).all(axis=1)
        flat = cost[live] - trial_cost <= _FTOL * cost[live]
        params[live[better]] = trial[better]
        cost[live[better]] = trial_cost[better]
        damping[live] = np.where(better, damping[live] / 10, damping[live] * 10)
        done[live] = (better & (small | flat)) | (damping[live] > _LAMBDA_MAX)
    inside = (done & (params[:, 0] >= 0) & (params[:, 1] >= 0) & (params[:, 2] >= 0) & (params[:, 2] <= bounds[2])
              & np.isfinite(params).all(axis=1))
    params[~inside] = np.nan
    return params


def _cost(u: np.ndarray, y: np.ndarray, w: np.ndarray, params: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        fitted = params[:, :1] + params[:, 1:2] * u ** -params[:, 2:3]
        return (w * (y - fitted) ** 2).sum(axis=1)
