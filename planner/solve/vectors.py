"""The enumeration behind the master (:mod:`planner.solve.master`): a block's Pareto-minimal slot vectors within a
budget, each with an assignment of its columns that puts exactly that on the linking rows.

Each stage's columns on one linking row form a table of the most rate ``n`` slots buy (:func:`_table`); the search
walks the free stages' dimensions depth first under exact least completions (staircases of Pareto-best sums,
:func:`_suffix_stairs`) and finishes each leaf with every choice of one cover vector per stage within the budget.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

MAX_CANDIDATES = 1_000_000
"""Most candidate vectors (before the Pareto filter) one block's enumeration may build."""


FEAS_TOL = 1e-7
"""Relative tolerance of the demand check (HiGHS's primal feasibility tolerance is 1e-7): a vector that covers the
demand to this is enumerated, so the bound holds for every plan HiGHS accepts."""


@dataclass
class Shape:
    """A block checked to be a cover, in the enumeration's terms."""

    idx: np.ndarray
    links: np.ndarray  # the linking rows
    price: np.ndarray  # dollars of block cost per slot, per linking row
    objective: np.ndarray  # the objective's own price per slot of the block's replicas, per linking row
    room: np.ndarray  # most slots per linking row (its bound less the least the other columns put there)
    demand: float  # in the demand row's units
    free: list[int]  # stages whose rates add up (single-stage streams)
    cover: list[int]  # stages of the one multi-stage stream (each must cover what the free stages leave)
    items: list[list[list[tuple[int, int, float, float]]]]  # per stage, per link: (column, slots, rate, most copies)
    streams: list[tuple[int, list[tuple[int, float]], float]]  # (column, [(stage, c_sk)], c_s)


@dataclass
class _Table:
    """The most rate of one stage on one linking row in ``n`` slots (``best[n]``, ``n = 0..N``), and the 0/1 chunks
    of the bounded knapsack that rebuild the assignment."""

    best: np.ndarray
    chunks: list[tuple[int, int, int, np.ndarray]]  # (column, copies, slots, whether taken at each n)
    breaks: np.ndarray  # n where best rises (and 0)

    def assignment(self, n: int, x: dict) -> None:
        """Add to ``x`` (column -> replicas) the replicas that carry ``best[n]`` in at most ``n`` slots."""
        for col, k, slots, took in reversed(self.chunks):
            if n > 0 and took[n]:
                x[col] = x.get(col, 0) + k
                n -= slots * k


def _table(items: list[tuple[int, int, float, float]], n_max: int) -> _Table:
    """The bounded knapsack of ``items`` (column, slots, rate, most copies) in 0..``n_max`` slots, each item's
    copies split into chunks of 1, 2, 4, ... (0/1 items)."""
    best = np.zeros(n_max + 1)
    chunks = []
    for j, slots, rate, most in items:
        copies = n_max // slots if not np.isfinite(most) else min(int(most), n_max // slots)
        k = 1
        while copies > 0:
            c = min(k, copies)
            w = c * slots
            cand = np.full(n_max + 1, -np.inf)
            cand[w:] = best[:-w] + c * rate
            took = cand > best
            best = np.where(took, cand, best)
            chunks.append((j, c, slots, took))
            copies -= c
            k *= 2
    breaks = np.concatenate([[0], np.flatnonzero(np.diff(best) > 0) + 1]).astype(np.int64)
    return _Table(best, chunks, breaks)


class TooMany(Exception):
    pass


class _VectorSearch:
    """The search of :func:`vectors`: the free part's dimensions walked depth first under exact least completions,
    each leaf finished by every choice of one cover vector per stage within the budget."""

    def __init__(self, sh: Shape, budget: float, deadline: float | None):
        self.sh, self.budget, self.deadline = sh, budget, deadline
        L = self.L = len(sh.links)
        price = self.price = sh.price.tolist()
        n_max = np.array([int(min(np.floor(budget / p + 1e-9), r)) for p, r in zip(price, sh.room, strict=True)])
        n_max = np.maximum(n_max, 0)
        self.tables = [[_table(sh.items[k][lk], int(n_max[lk])) for lk in range(L)] for k in range(len(sh.items))]
        D = self.D = sh.demand
        self.tol = tol = FEAS_TOL * max(1.0, abs(D))
        self.eps = eps = 1e-9 * max(1.0, abs(budget))
        # Exact least costs of what is left, as staircases (cost, rate) of Pareto-best sums of the tables'
        # breakpoints: per cover stage over links >= l, and of the free dimensions >= d; rates capped at the demand.
        cap = D + tol
        self.cover_from = {k: _suffix_stairs([self._part(k, lk, cap) for lk in range(L)], budget + eps, cap)
                           for k in sh.cover}
        self.cover_all = [self.cover_from[k][0] for k in sh.cover]
        self.free_links = [(k, lk) for lk in range(L) for k in sh.free]  # the free part's dimensions, link-major
        last = None  # the free dimensions' sums alone (the point (0, 0) after the last)
        if sh.cover:  # ... with every cover stage carrying the rest: exact least completions
            rhos = np.unique(np.concatenate([r for _, r in self.cover_all]))
            g = sum(_stair_cost(stairs, rhos, tol) for stairs in self.cover_all)
            finite = np.isfinite(g)
            last = _combine(g[finite], rhos[finite], np.zeros(1), np.zeros(1), budget + eps, cap)
        self.complete = [(c.tolist(), r.tolist()) for c, r in _suffix_stairs(
            [self._part(k, lk, cap) for k, lk in self.free_links], budget + eps, cap, last=last)]
        self.lists_of = [[(t.best.tolist(), t.breaks.tolist()) for t in per] for per in self.tables]
        self.out_vecs: list[np.ndarray] = []  # candidate slot vectors, in batches (rows)
        self.out_recipes: list[tuple[list, list]] = []  # per batch: the free part's (stage, link, n), and per cover
        # stage the chosen vectors' n per link (rows, one per candidate)
        self.count = 0
        self.nodes = 0

    def _part(self, k, lk, cap):
        t = self.tables[k][lk]
        return self.price[lk] * t.breaks.astype(float), np.minimum(t.best[t.breaks], cap)

    def completion(self, d, rem):
        """Least cost of carrying ``rem`` more with the free dimensions >= d and the cover stages."""
        c, r = self.complete[d]
        i = bisect_left(r, rem - self.tol)
        return c[i] if i < len(c) else np.inf

    def emit(self, vecs, free_parts, cover_ns):
        self.count += len(vecs)
        if self.count > MAX_CANDIDATES or (self.deadline is not None and time.perf_counter() > self.deadline):
            raise TooMany
        self.out_vecs.append(vecs)
        self.out_recipes.append((free_parts, cover_ns))

    def covers(self, k, need, b):
        """Vectors of stage k that carry ``need`` at cost <= b, each minimal on the links it leaves the search at
        (the final Pareto filter removes the rest): (cost, n per link)."""
        L, tol, eps, price = self.L, self.tol, self.eps, self.price
        found = []
        stairs = [(c.tolist(), r.tolist()) for c, r in self.cover_from[k]]

        def rec(lk, rem, cost, ns):
            if rem <= tol:
                found.append((cost, ns + [0] * (L - lk)))
                return
            if lk == L:
                return
            c_s, r_s = stairs[lk]
            i = bisect_left(r_s, rem - tol)
            if i == len(c_s) or cost + c_s[i] > b + eps:
                return
            best, breaks = self.lists_of[k][lk]
            if lk == L - 1:
                i = bisect_left(best, rem - tol)
                if i < len(best) and cost + price[lk] * i <= b + eps:
                    found.append((cost + price[lk] * i, ns + [i]))
                return
            for n in breaks:
                c = cost + price[lk] * n
                if c > b + eps:
                    break
                rec(lk + 1, rem - best[n], c, ns + [n])
                if best[n] >= rem - tol:
                    break
                if len(found) > MAX_CANDIDATES:
                    raise TooMany

        rec(0, need, 0.0, [])
        return found

    def finish(self, vec, cost, got, parts):
        sh, tol, budget, eps = self.sh, self.tol, self.budget, self.eps
        need = self.D - got
        if need <= tol:
            self.emit(vec[None, :].copy(), parts, [])
            return
        if not sh.cover:
            return
        # each stage within what the others leave: first their exact least, then what the others' lists hold
        b = budget - cost
        least = [_stair_cost(self.cover_all[i], need, tol) for i in range(len(sh.cover))]
        lists = []
        for i, k in enumerate(sh.cover):
            li = self.covers(k, need, b - (sum(least) - least[i]))
            if not li:
                return
            least[i] = min(c for c, _ in li)
            lists.append(li)
        # every choice of one vector per stage within the budget, summed onto the free part (arrays), then the
        # Pareto-minimal ones of them
        sums = vec[None, :].astype(np.int64)
        spent = np.array([cost])
        picks: list[np.ndarray] = []
        for i, li in enumerate(lists):
            c = np.array([ci for ci, _ in li])
            ns = np.array([n for _, n in li], dtype=np.int64)
            rest = sum(least[i + 1:])
            ok = spent[:, None] + c[None, :] + rest <= budget + eps
            a_i, o_i = np.nonzero(ok)
            sums = sums[a_i] + ns[o_i]
            spent = spent[a_i] + c[o_i]
            picks = [p[a_i] for p in picks] + [ns[o_i]]
            if not len(sums):
                return
        self.emit(sums, parts, picks)  # the Pareto filter runs once, on all candidates

    def walk(self, d, vec, cost, got, parts):
        self.nodes += 1
        if self.deadline is not None and self.nodes % 4096 == 0 and time.perf_counter() > self.deadline:
            raise TooMany
        rem = self.D - got
        if rem > self.tol and cost + self.completion(d, rem) > self.budget + self.eps:
            return
        if d == len(self.free_links) or rem <= self.tol:
            self.finish(vec, cost, got, parts)
            return
        k, lk = self.free_links[d]
        t = self.tables[k][lk]
        for n in t.breaks.tolist():
            c = cost + self.price[lk] * n
            if c > self.budget + self.eps:
                break
            if n:
                vec[lk] += n
            self.walk(d + 1, vec, c, got + t.best[n], parts + ([(k, lk, n)] if n else []))
            if n:
                vec[lk] -= n
            if got + t.best[n] >= self.D - self.tol:
                break

    def result(self) -> list[tuple[np.ndarray, dict]]:
        """The Pareto-minimal candidates, each with the assignment of columns that puts it on the links."""
        if not self.out_vecs:
            return []
        vecs = np.concatenate(self.out_vecs)
        batch = np.repeat(np.arange(len(self.out_vecs)), [len(v) for v in self.out_vecs])
        row = np.concatenate([np.arange(len(v)) for v in self.out_vecs])
        _, first = np.unique(vecs, axis=0, return_index=True)
        vecs, batch, row = vecs[first], batch[first], row[first]
        keep = _minimal(vecs)
        result = []
        for i in np.flatnonzero(keep):
            free_parts, cover_ns = self.out_recipes[batch[i]]
            x: dict[int, float] = {}
            for k, lk, n in free_parts:
                self.tables[k][lk].assignment(n, x)
            for k, ns in zip(self.sh.cover, cover_ns, strict=False):  # none where the free part covers the demand
                for lk, n in enumerate(ns[row[i]].tolist()):
                    if n:
                        self.tables[k][lk].assignment(n, x)
            result.append((vecs[i], _with_streams(self.sh, x)))
        return result


def vectors(sh: Shape, budget: float, *, deadline: float | None = None) -> list[tuple[np.ndarray, dict]]:
    """The block's Pareto-minimal slot vectors of cost at most ``budget`` (over its linking rows), each with an
    assignment of its columns (column -> value) that puts exactly that on them and meets its rows. Raises
    :class:`TooMany` past :data:`MAX_CANDIDATES` candidates or ``deadline`` (``time.perf_counter()``)."""
    search = _VectorSearch(sh, budget, deadline)
    search.walk(0, np.zeros(search.L, dtype=np.int64), 0.0, 0.0, [])
    return search.result()


def _minimal(vecs: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Which rows of ``vecs`` no other row is at most on every column and below on one (distinct rows): by rising
    sum (a row below another has the smaller sum), a chunk at a time against the rows kept and then itself."""
    n = len(vecs)
    if n <= chunk:
        return ~_below(vecs, vecs).any(0)
    order = np.argsort(vecs.sum(1), kind="stable")
    keep = np.zeros(n, dtype=bool)
    kept = np.empty((0, vecs.shape[1]), dtype=vecs.dtype)
    for start in range(0, n, chunk):
        part = order[start:start + chunk]
        v = vecs[part]
        ok = ~_below(kept, v).any(0) if len(kept) else np.ones(len(v), dtype=bool)
        ok &= ~_below(v, v).any(0)  # within the chunk (a row the kept ones beat beats none the kept ones do not)
        keep[part[ok]] = True
        kept = np.concatenate([kept, v[ok]])
    return keep


def _below(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[i, j]``: row ``a[i]`` is at most ``b[j]`` on every column and differs from it."""
    le = (a[:, None, :] <= b[None, :, :]).all(2)
    return le & (a[:, None, :] != b[None, :, :]).any(2)


def _stair_cost(stairs: tuple[np.ndarray, np.ndarray], need, tol: float):
    """The least cost of carrying ``need`` (a number or an array) on a staircase (:func:`_suffix_stairs`): the cost
    of its first point of rate at least ``need``; ``inf`` where none is."""
    c, r = stairs
    i = np.searchsorted(r, np.asarray(need) - tol)
    out = np.where(i < len(c), c[np.minimum(i, len(c) - 1)], np.inf)
    return float(out) if out.ndim == 0 else out


def _suffix_stairs(parts: list[tuple[np.ndarray, np.ndarray]], budget: float, cap: float,
                   last: tuple[np.ndarray, np.ndarray] | None = None) -> list:
    """For each ``d``, the Pareto-best (least cost, most rate) sums of one point of each of ``parts[d:]`` (per part,
    its costs and rates), as arrays sorted by cost (rates then rise), cost at most ``budget``, rates capped at
    ``cap``: the least cost of carrying ``r`` with them is the cost of the first point of rate at least ``r``.
    ``last``: a staircase every sum also takes one point of (default: the point (0, 0))."""
    out = [(np.zeros(1), np.zeros(1)) if last is None else last]
    for pc, pr in reversed(parts):
        out.append(_combine(pc, pr, *out[-1], budget, cap))
    return out[::-1]


def _combine(pc, pr, c, r, budget: float, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """The Pareto-best sums of a point of ``(pc, pr)`` and one of ``(c, r)`` (costs, rates), as :func:`_suffix_stairs`."""
    C = (pc[:, None] + c[None, :]).ravel()
    R = np.minimum((pr[:, None] + r[None, :]).ravel(), cap)
    ok = C <= budget
    C, R = C[ok], R[ok]
    o = np.lexsort((-R, C))
    C, R = C[o], R[o]
    keep = R > np.concatenate([[-1.0], np.maximum.accumulate(R)[:-1]])
    return C[keep], R[keep]


def _with_streams(sh: Shape, x: dict) -> dict:
    """The assignment with each stream at the most its stages carry (its rows hold; the demand row too)."""
    carried: dict[int, float] = {}
    for k, per_link in enumerate(sh.items):
        for lst in per_link:
            for j, _, rate, _ in lst:
                carried[k] = carried.get(k, 0.0) + rate * x.get(j, 0)
    out = dict(x)
    for s, stages, c_s in sh.streams:
        # stage k's items carry rate * c_s / c_sk of demand, so the stream may carry carried_k / c_s
        out[s] = min(carried.get(k, 0.0) / c_s for k, _ in stages)
    return out
