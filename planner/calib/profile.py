"""Which factors of a (hardware, engine) pair's fit to keep free: the profile cost of returning the others to
their prior, with the kept ones refitted (:func:`planner.calib.fit.restrict`).

Returning a factor to its prior alone, the others held, overstates what it costs wherever another factor can take
up its effect (a per-sequence overhead and an attention efficiency both grow a step with its batch): the rows do
not identify either, yet each looks dear on its own, and which of them a pair keeps then flips with small changes
of the data. The profile cost asks the question that matters: how much worse do the rows fit with a set of
factors back at the prior and the rest refitted?

It is computed on the Gauss-Newton model of the robust loss at the pair's full fit: residuals ``r0`` (the weighted
log errors), a column per factor with the secant slope of the residuals along its return to the prior (the same
predictions the one-at-a-time cost needed, so no more of them), and the soft-L1 loss's iteratively reweighted
least-squares weights. For a set ``S`` returned by offsets ``d_S`` and the rest ``K`` refitted by ``e_K``:

    cost(S) = min over e_K of  sum_i w_i (r0_i + (J_S d_S)_i + (J_K e_K)_i)^2 - sum_i w_i r0_i^2

which, with ``A = J^T W J`` and ``b = J^T W r0``, is ``d^T A_SS d + 2 d^T b_S - g^T A_KK^-1 g`` with
``g = b_K + A_KS d``. Every kept set of the allowed size is enumerated where there are at most
:data:`EXACT_SETS` of them, else the returned set grows greedily. Pure NumPy: no file, no solver.
"""

from __future__ import annotations

from itertools import combinations
from math import comb

import numpy as np

EXACT_SETS = 60_000
"""Kept sets enumerated at most (C(free, limit)); beyond, factors return to the prior one at a time, cheapest first."""
RIDGE = 1e-9
"""Relative ridge on the normal matrix: factors the rows cannot tell apart give a singular one."""


def _normal(jac: np.ndarray, w: np.ndarray, r0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    jw = jac * w[:, None]
    a = jac.T @ jw
    a = a + RIDGE * max(float(np.max(np.diag(a))), 1e-30) * np.eye(len(a))
    return a, jw.T @ r0


def set_costs(a: np.ndarray, b: np.ndarray, delta: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Profile cost of each kept set (rows of ``kept``: indices of the factors refitted, the rest returned to the
    prior by ``delta``) under the normal equations ``a``, ``b`` (module docstring)."""
    p = len(delta)
    out = np.empty(len(kept))
    for lo in range(0, len(kept), 8192):
        k = kept[lo:lo + 8192]
        ret = np.ones((len(k), p), bool)
        np.put_along_axis(ret, k, False, axis=1)
        d = np.where(ret, delta[None, :], 0.0)  # offsets of the returned factors, zero on the kept ones
        fixed = np.einsum("np,pq,nq->n", d, a, d) + 2.0 * d @ b
        g = np.take_along_axis(b[None, :] + d @ a, k, axis=1)
        akk = a[k[:, :, None], k[:, None, :]]
        out[lo:lo + len(k)] = fixed - np.einsum("nk,nk->n", g, np.linalg.solve(akk, g[:, :, None])[:, :, 0])
    return out


def keep_by_profile(jac: np.ndarray, w: np.ndarray, r0: np.ndarray, delta: np.ndarray,
                    limit: int) -> tuple[list[int], float]:
    """(indices of the ``limit`` factors to keep free, the profile cost of returning the others): the kept set whose
    others' return to the prior (by ``delta``) costs least with the kept ones refitted. ``jac``: residual slopes
    (rows x factors), ``w``: row weights, ``r0``: residuals at the full fit."""
    p = jac.shape[1]
    if p <= limit:
        return list(range(p)), 0.0
    a, b = _normal(jac, w, r0)
    delta = np.asarray(delta, float)
    if comb(p, limit) <= EXACT_SETS:
        kept = np.array(list(combinations(range(p), limit)), dtype=int)
        c = set_costs(a, b, delta, kept)
        i = int(np.argmin(c))
        return [int(j) for j in kept[i]], float(c[i])
    keep = list(range(p))
    cost = 0.0
    while len(keep) > limit:
        trials = np.array([[j for j in keep if j != drop] for drop in keep], dtype=int)
        c = set_costs(a, b, delta, trials)
        i = int(np.argmin(c))
        keep, cost = [int(j) for j in trials[i]], float(c[i])
    return keep, cost
