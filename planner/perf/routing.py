"""Skewed expert routing: what the busiest expert-parallel rank of a fused MoE layer computes and streams.

A fused MoE layer's time on one GPU follows three counts of its local experts (``kernels.moe_time``): the token
copies routed to them (maths), the experts at least one copy touches (weights streamed) and the rows after each
expert's copies are padded to a tensor-core tile (maths as issued). Uniform routing gives them in closed form
(``kernels.uniform_moe_load``). Real routers are skewed: a few hot experts take many tokens and many take few, so
the rank that holds the hot experts carries more copies than the mean (the layer waits for it) while, at a few
tokens a step, fewer experts are touched (less weight traffic).

:func:`power_law_load` gives the three counts on the busiest rank for per-expert loads drawn from a truncated power
law (density ``x^-alpha`` on ``[x_min, x_max]``), normalised to the step's ``tokens x top_k`` copies, rounded to
whole copies and capped at one copy of each token per expert, the overflow and the rounding remainder spread
round-robin over the ranks; ranks hold contiguous blocks of experts and the busiest block is reported. This is the skew the kernel collectors measure as ``power_law_ALPHA``
(``x_min = 1``, ``x_max = 0.8 tokens`` when copies outnumber experts, else ``[0.01, 2]``), and ``alpha`` about
1.0-1.2 is what those collectors' authors matched to DeepSeek-V3 and Qwen3 serving. The counts are means over a
fixed set of seeded draws, so a prediction is reproducible.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from planner.perf.kernels import TILE_M

DRAWS = 32
"""Seeded draws a load's counts are averaged over (the collectors average 10 routings per measured latency)."""
X_MAX_SHARE = 0.8
"""``x_max`` of the power law as a share of the step's tokens when copies outnumber experts."""
SPARSE_RANGE = (0.01, 2.0)
"""``(x_min, x_max)`` when there are fewer copies than experts (most experts then get none)."""


def _power_law(u: np.ndarray, alpha: float, lo: float, hi: float) -> np.ndarray:
    """Inverse CDF of the power law ``x^-alpha`` truncated to ``[lo, hi]`` at uniform ``u``."""
    if abs(alpha - 1.0) < 1e-9:
        return lo * (hi / lo) ** u
    a = 1.0 - alpha
    return ((hi ** a - lo ** a) * u + lo ** a) ** (1.0 / a)


def _spread(load: np.ndarray, remaining: np.ndarray, cap: int, step: int) -> np.ndarray:
    """Add ``step`` (+1 or -1) ``remaining`` times per draw, round-robin over the ranks (axis 1) starting at the
    first, each time to the rank's least loaded expert below ``cap`` (+1) or its most loaded one above zero (-1)."""
    d, g, _ = load.shape
    per = remaining[:, None] // g + (np.arange(g)[None, :] < (remaining[:, None] % g))
    for _ in range(int(per.max(initial=0))):
        todo = per > 0
        if step > 0:
            score = np.where(load < cap, load, np.iinfo(np.int64).max)
            pick = np.argmin(score, axis=2)
            ok = np.take_along_axis(load, pick[..., None], axis=2)[..., 0] < cap
        else:
            score = np.where(load > 0, load, -1)
            pick = np.argmax(score, axis=2)
            ok = np.take_along_axis(load, pick[..., None], axis=2)[..., 0] > 0
        hit = todo & ok
        ii, jj = np.nonzero(hit)
        load[ii, jj, pick[ii, jj]] += step
        per = per - hit
        if not hit.any():
            break
    return load


def _whole_copies(share: np.ndarray, copies: int, cap: int, ranks: int) -> np.ndarray:
    """Per draw (rows), ``share`` of ``copies`` as whole copies, shaped (draws, ranks, experts a rank): rounded,
    each expert capped at ``cap`` copies (a token's copies go to distinct experts) with the overflow and then the
    rounding remainder spread round-robin over the ranks, to each rank's least loaded expert (or, to take copies
    away, from its most loaded), as the collectors do."""
    d, e = share.shape
    load = np.rint(share * copies).astype(np.int64).reshape(d, ranks, e // ranks)
    over = np.clip(load - cap, 0, None).sum(axis=(1, 2))
    load = np.minimum(load, cap)
    load = _spread(load, over, cap, 1)
    delta = copies - load.sum(axis=(1, 2))
    load = _spread(load, np.clip(delta, 0, None), cap, 1)
    return _spread(load, np.clip(-delta, 0, None), cap, -1)


@lru_cache(maxsize=65536)
def power_law_load(tokens: int, experts: int, top_k: int, ep: int, alpha: float,
                   draws: int = DRAWS, seed: int = 0) -> tuple[float, float, float]:
    """(copies, touched experts, tile-padded rows) on the busiest of ``ep`` ranks (contiguous blocks of
    ``experts / ep`` experts) when ``tokens`` tokens each pick ``top_k`` experts with power-law loads of exponent
    ``alpha``; means over ``draws`` seeded draws. ``ep`` must divide ``experts`` (ValueError otherwise)."""
    t, e, k, g = max(int(tokens), 1), int(experts), int(top_k), max(int(ep), 1)
    if e % g:
        raise ValueError(f"expert parallelism {g} does not divide {e} experts")
    copies = t * k
    rng = np.random.default_rng(seed)
    u = rng.random((draws, e))
    lo, hi = (1.0, X_MAX_SHARE * t) if copies > e else SPARSE_RANGE
    x = _power_law(u, alpha, lo, max(hi, lo * (1.0 + 1e-9)))
    block = _whole_copies(x / x.sum(axis=1, keepdims=True), copies, t, g)
    busiest = np.argmax(block.sum(axis=2), axis=1)
    mine = block[np.arange(draws), busiest]
    rows = np.ceil(mine / TILE_M) * TILE_M
    return float(mine.sum(axis=1).mean()), float((mine > 0).sum(axis=1).mean()), float(rows.sum(axis=1).mean())


def power_law_loads(tokens, experts, top_k, ep, alpha) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`power_law_load` per element (arrays broadcast; each distinct shape is drawn once)."""
    arrs = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (tokens, experts, top_k, ep, alpha)))
    keys = np.stack([np.floor(arrs[0]), *arrs[1:4], np.round(arrs[4], 6)], axis=-1).reshape(-1, 5)
    uniq, back = np.unique(keys, axis=0, return_inverse=True)
    vals = np.array([power_law_load(int(a), int(b), int(c), int(d), float(f)) for a, b, c, d, f in uniq]).reshape(-1, 3)
    out = vals[np.ravel(back)].reshape(*arrs[0].shape, 3)
    return out[..., 0], out[..., 1], out[..., 2]

