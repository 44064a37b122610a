"""Pruning the candidate table: rows no plan needs (dominated on cost per request/s among rows that share a
workload, role and hardware, and can mix in whole units), kept exact for every demand and working set in range.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from planner.units import GB

PRUNE_KEYS = ["workload", "role", "hardware", "pairing", "prefix_tier"]
"""Rows compared for dominance; ``pairing`` is the engine and KV format for prefill and decode rows (a prefill row
pairs only with a decode row of its own engine and vendor holding the KV in the same format, so a row of another
engine or format is no substitute for it; the vendor follows from the hardware) and nothing for aggregated rows."""


MIX_KEYS = ["workload", "role", "hardware", "pairing"]


def pairing(df, by_engine: bool = False) -> np.ndarray:
    """The ``pairing`` key of :data:`PRUNE_KEYS`: the engine and KV format (``engine/kv``) of prefill and decode rows,
    ``""`` of the others (``by_engine``: the engine of every row, with the KV format of prefill and decode rows: from a
    deployed fleet, a row on an engine the workload runs is no substitute for one on a new engine, which costs a
    re-engine)."""
    role = df["role"].astype(str).to_numpy()
    engine = df["engine"].astype(str) if "engine" in df else pd.Series("", index=df.index)
    cls = engine + "/" + df["kv_dtype"].astype(str) if "kv_dtype" in df else engine
    return np.where(np.isin(role, ("prefill", "decode")), cls.to_numpy(dtype=object),
                    engine.to_numpy(dtype=object) if by_engine else "")


def mixes_allowed(sc) -> bool:
    """Whether a row that a mix of several other rows beats may be pruned (:func:`prune_dominated`): not
    where the scenario limits or prices pool types (the mix is more pool types than the row) or asks for N+k
    (its per-unit loss bound is read from the rows), nor where the plan starts from a deployed fleet (each new
    pool type is a change that costs)."""
    lim = sc.limits
    return not (lim.max_pool_types_per_workload or lim.pool_type_usd_per_hour or sc.resilience.lose_units
                or sc.existing is not None)


def prune_dominated(df: pd.DataFrame, shares: dict[str, tuple[float, float]] | None = None, *,
                    mixes: bool = False, protect: np.ndarray | None = None) -> tuple[pd.DataFrame, int]:
    """Drop rows the MILP never needs.

    In the MILP a row is only its packing footprint ``slots``, its request rate and, where it reuses
    prefixes, whether one replica holds its share of the working set: ``pcap / working_set >= rate / demand``,
    i.e. its prefix bytes per request/s ``pcap / rate`` reach the workload's ``working_set / demand`` (every
    row left meets its SLOs and fits in memory). With ``shares[w] = (lo, hi)`` the range of ``working_set /
    demand`` the model may be given (:func:`prefix_shares`), row B is dominated by row A of the same
    (workload, role, hardware, pairing, prefix tier) when ``k = slots_B / slots_A`` is a whole number, ``k`` replicas
    of A give at least B's rate, and A is usable wherever in that range B is (:func:`usable_share`): any plan
    using B is matched, at the same units, power and cost, by one using A. Ties keep the first row (fastest
    TPOT). A workload missing from ``shares`` is pruned for any working set and demand.

    With ``mixes`` (:func:`mixes_allowed`), a row left is then also dropped where rows left of its (workload,
    role, hardware), of any prefix tier, each usable wherever it is, beat it: one of its footprint with at least
    its rate, or replicas of several that give at least its rate in fewer slots (:func:`mix_kept`). A row
    without prefix reuse is usable at any working set. In the MILP such a mix replaces the row at the same
    units, power and cost; what it may add is pool types, which is why a scenario that limits or prices them
    keeps the row.

    ``protect`` (a mask over ``df``'s rows: the deployed pools' layouts, which cost nothing to keep where any
    other layout costs a change) keeps the rows among them that no protected row dominates, whatever the others
    dominate; with it, rows are compared only with rows of their own engine (a new engine costs more to adopt).
    """
    if df.empty:
        return df, 0
    shares = shares or {}
    keep = np.zeros(len(df), dtype=bool)
    df = df.assign(pairing=pairing(df, by_engine=protect is not None))
    s, q = df["slots"].to_numpy(float), df["requests_per_s"].to_numpy(float)
    # TPOT as the SLO judges it (at its quantile) where the selection recorded it
    c, t = df["prefix_bytes_per_replica"].to_numpy(float), df["tpot_slo_s" if "tpot_slo_s" in df else "tpot_s"].to_numpy(float)
    wl = df["workload"].astype(str).to_numpy()
    for idx in df.groupby(PRUNE_KEYS, observed=True, sort=False).indices.values():
        share = usable_share(c[idx], q[idx], shares.get(wl[idx[0]], (0.0, np.inf)))
        keep[idx[nondominated(s[idx], q[idx], share, t[idx])]] = True
    _drop_dominated_pairings(df, keep, s, q, c, t, shares)
    if mixes:
        left = np.flatnonzero(keep)
        sub = df.iloc[left]
        cap = np.where(sub["prefix_tier"].astype(str).to_numpy() == "none", np.inf, c[left])
        for idx in sub.groupby(MIX_KEYS, observed=True, sort=False).indices.values():
            rows = left[idx]
            share = usable_share(cap[idx], q[rows], shares.get(wl[rows[0]], (0.0, np.inf)))
            keep[rows[~mix_kept(s[rows], q[rows], share)]] = False
    if protect is not None and protect.any():
        mine = np.flatnonzero(protect)
        sub = df.iloc[mine].drop(columns="pairing").reset_index(drop=True)
        left, _ = prune_dominated(sub, shares, protect=np.zeros(len(sub), dtype=bool))
        keep[mine[left.index.to_numpy()]] = True
    out = df[keep].drop(columns="pairing")
    return out, len(df) - len(out)


def _drop_dominated_pairings(df, keep: np.ndarray, s, q, c, t, shares: dict) -> None:
    """Drop (in ``keep``) a workload's prefill and decode rows of an engine that another engine beats in both roles:
    in every (role, hardware, prefix tier) group where the first has rows kept, the second has rows and each of
    the first's is dominated among the two engines' rows (:func:`nondominated`). Any plan that pairs on the
    first is then matched, at the same units and cost, by one that pairs on the second; where each engine is
    better at one role (one's prefill, the other's decode), both stay. Ties keep the first row, so two equal
    engines keep both (conservative)."""
    role = df["role"].astype(str).to_numpy()
    pd_rows = np.flatnonzero(keep & np.isin(role, ("prefill", "decode")))
    if not len(pd_rows):
        return
    sub = df.iloc[pd_rows]
    eng = sub["pairing"].to_numpy()
    groups = list(zip(sub["role"].astype(str), sub["hardware"].astype(str), sub["prefix_tier"].astype(str),
                      strict=True))
    for w in np.unique(sub["workload"].astype(str).to_numpy()):
        mine = sub["workload"].astype(str).to_numpy() == w
        engines = sorted(set(eng[mine]))
        dropped: set = set()
        for b in engines:
            for a in engines:
                if a == b or a in dropped or b in dropped:
                    continue
                if _beaten(pd_rows, mine, eng, groups, a, b, s, q, c, t, shares.get(w, (0.0, np.inf))):
                    keep[pd_rows[mine & (eng == b)]] = False
                    dropped.add(b)


def _beaten(pd_rows, mine, eng, groups, a, b, s, q, c, t, share) -> bool:
    """Whether engine ``a``'s rows dominate every row of engine ``b`` in each of ``b``'s groups."""
    for g in {groups[i] for i in np.flatnonzero(mine & (eng == b))}:
        in_g = np.array([groups[i] == g for i in range(len(groups))]) & mine
        ours, theirs = in_g & (eng == a), in_g & (eng == b)
        if not ours.any():
            return False
        idx = pd_rows[ours | theirs]
        kept = nondominated(s[idx], q[idx], usable_share(c[idx], q[idx], share), t[idx])
        if kept[(eng[ours | theirs] == b)].any():
            return False
    return True


def mix_kept(slots, rate, capacity) -> np.ndarray:
    """Mask of the rows of one (workload, role, hardware) group that no mix of the others beats, among rows
    usable wherever the row is (``capacity``, its prefix bytes per request/s as :func:`usable_share` gives it, at
    least the row's): one row of its footprint with at least its ``rate``, or replicas of rows that give at least
    its rate in *fewer* slots than its ``slots``. A plan using the row costs the same with the other row instead
    (the same slots, as many pool types), or with the mix (fewer slots, which the objective's tie-break prefers:
    no optimum uses the row), so dropping it leaves the MILP every plan it may choose, up to equal rows (a mix
    in exactly the row's slots is no reason: the row alone is one pool type where the mix is several).

    Rows are taken by capacity (descending), then footprint (ascending), then rate (descending), then position,
    so every row such a mix may use (capacity at least its own and a smaller footprint, or its footprint and at
    least its rate) comes before it. ``F[n]``, the most rate replicas of the rows kept so far give in at most
    ``n`` slots, is an unbounded knapsack over whole slots extended by each kept row; a row dropped earlier
    needs no place in it, the rows that beat it are there. Of equal rows the first stays. Footprints that are
    not whole numbers of slots are scaled to whole numbers where a small factor does it; else nothing is
    dropped."""
    n = len(slots)
    keep = np.ones(n, dtype=bool)
    if n <= 1:
        return keep
    whole = _whole_slots(np.asarray(slots, dtype=float))
    if whole is None or whole.min() < 1:
        return keep
    rate = np.asarray(rate, dtype=float)
    best = np.zeros(int(whole.max()) + 1)  # F[n]: most rate in at most n slots from the rows kept so far
    single = np.full(len(best), -np.inf)  # most rate of one kept row of n slots
    for i in np.lexsort((np.arange(n), -rate, whole, -np.asarray(capacity, dtype=float))):
        k = int(whole[i])
        if max(best[k - 1], single[k]) >= rate[i] * (1 - 1e-12):
            keep[i] = False
            continue
        _add_replicas(best, k, rate[i])
        single[k] = max(single[k], rate[i])
    return keep


def _whole_slots(slots: np.ndarray, most: int = 1 << 16) -> np.ndarray | None:
    """``slots`` times the smallest factor of 1 to 100 that makes each a whole number (at most ``most``),
    as integers; ``None`` where none does."""
    for f in range(1, 101):
        v = slots * f
        r = np.rint(v)
        if np.all(np.abs(v - r) <= 1e-9 * np.maximum(v, 1.0)):
            return r.astype(np.int64) if r.max() <= most else None
    return None


def _add_replicas(best: np.ndarray, k: int, q: float) -> None:
    """``best[n] = max over j of best[n - j k] + j q`` in place: any number of replicas of ``k`` slots and rate
    ``q`` added to the rows ``best`` is of. Along each residue of ``n`` modulo ``k`` that is a running maximum
    of ``best[n] - (n // k) q``, one vectorised pass."""
    size = len(best)
    rows = -(-size // k)
    pad = np.full(rows * k, -np.inf)
    pad[:size] = best
    grid = pad.reshape(rows, k)
    step = np.arange(rows, dtype=float)[:, None] * q
    best[:] = (np.maximum.accumulate(grid - step, axis=0) + step).reshape(-1)[:size]


def nondominated(slots, rate, capacity, tpot, groups=None) -> np.ndarray:
    """Mask of the rows of one (workload, role, hardware, prefix tier) group that :func:`prune_dominated`
    keeps; ``capacity`` is each row's prefix bytes per request/s as :func:`usable_share` gives it. Rows in
    order of footprint (ascending), rate and capacity (descending), TPOT (ascending), then position; a row goes
    when an earlier row of its footprint has at least its capacity (it has at least its rate), or a row of a
    footprint ``k`` times smaller, ``k`` whole, gives at least its rate ``k`` times over and has at least its
    capacity. The first test leaves a few rows per footprint (the Pareto front of rate and capacity);
    the second compares those all against all (dominance is transitive, so being dominated by any of them is
    being dominated by one that is kept). ``groups``: small non-negative integers, equal exactly where ``slots``
    are (the footprint's index; computed here when not given)."""
    n = len(slots)
    if n <= 1:
        return np.ones(n, dtype=bool)
    if n > 64:
        # Most rows of a chunk trail the fastest row of their footprint in rate and capacity: off the front, so
        # never kept. Sorting only the others gives the same answer (rows equal to that best row stay). The
        # footprints are few: per-footprint maxima over a (footprints x rows) table, no sort.
        if groups is None:
            _, groups = np.unique(slots, return_inverse=True)
        g = np.asarray(groups).reshape(-1)
        at = np.arange(n)
        table = np.full((int(g.max()) + 1, n), -np.inf)
        table[g, at] = rate
        qb = table.max(axis=1)[g]
        top = rate == qb
        table.fill(-np.inf)
        table[g[top], at[top]] = capacity[top]
        cb = table.max(axis=1)[g]
        live = np.flatnonzero(~((rate <= qb) & (capacity <= cb) & ((rate < qb) | (capacity < cb))))
        if live.size < n:
            keep = np.zeros(n, dtype=bool)
            keep[live[_front_kept(slots[live], rate[live], capacity[live], tpot[live])]] = True
            return keep
    return _front_kept(slots, rate, capacity, tpot)


def bound_dominated(groups, rate, capacity, upper, cap_bound) -> np.ndarray:
    """Rows whose rate is not known, only bounded (``upper``, NaN elsewhere; their capacity at most ``cap_bound``),
    that :func:`nondominated` would drop whatever their rate: a row of their footprint (``groups``, small
    non-negative integers) whose rate is known (``rate`` and ``capacity``, NaN where not) exceeds their upper bound
    and whose capacity is at least their bound comes before them and has at least their capacity. Dropping them
    first changes nothing else that is kept (what they would beat, that row beats). The load search can then skip
    them (:func:`planner.perf.candidates._stream_filter`)."""
    groups = np.asarray(groups, dtype=np.int64)
    out = np.zeros(len(groups), dtype=bool)
    unknown = np.isfinite(upper) & np.isfinite(cap_bound)
    known = np.isfinite(rate)
    if not unknown.any() or not known.any():
        return out
    size = int(groups.max()) + 1
    for c in np.unique(cap_bound[unknown]):
        a = known & (capacity >= c)
        best = np.full(size, -np.inf)
        np.maximum.at(best, groups[a], rate[a])
        b = np.flatnonzero(unknown & (cap_bound == c))
        out[b] = best[groups[b]] > upper[b]
    return out


def _front_kept(slots, rate, capacity, tpot) -> np.ndarray:
    """:func:`nondominated` on rows already cleared of those that trail their footprint's fastest row (or on
    few rows): the sort, the front of each footprint and the whole-multiple test."""
    n = len(slots)
    order = np.lexsort((tpot, -capacity, -rate, slots))  # stable: ties stay in position order
    S, Q, C = slots[order], rate[order], capacity[order]
    # Front of each footprint: capacity above every earlier row's of that footprint. One running maximum over
    # keys that put each footprint above the ones before it (footprint index, then capacity's dense rank) is
    # exact and needs no loop over footprints.
    group = np.cumsum(np.concatenate(([0], S[1:] != S[:-1])))
    _, rank = np.unique(C, return_inverse=True)
    key = group * (n + 1) + rank.reshape(-1)
    prev = np.empty(n, dtype=key.dtype)
    prev[0] = -1
    np.maximum.accumulate(key[:-1], out=prev[1:])
    P = np.flatnonzero(key > prev)
    keep = np.zeros(n, dtype=bool)
    for lo in range(0, len(P), 1024):  # blocks of rows against every front row: memory stays small
        i = P[lo:lo + 1024]
        ratio = S[i][:, None] / S[P][None, :]
        k = np.rint(ratio)
        covered = ((np.abs(ratio - k) < 1e-9) & (k > 1)
                   & (k * Q[P][None, :] >= Q[i][:, None] * (1 - 1e-12))
                   & (C[P][None, :] >= C[i][:, None] * (1 - 1e-12))).any(axis=1)
        keep[order[i[~covered]]] = True
    return keep


def prefix_shares(workloads, low: float = 1.0, high: float = 1.0) -> dict[str, tuple[float, float]]:
    """Per workload that reuses prefixes, the range ``(lo, hi)`` of prefix working set per request/s (bytes
    per req/s) a model may be given: the scenario's ``working_set / requests_per_s`` times ``low`` and ``high``
    (a caller that will change demand or working sets widens it), the lowest positive period of a traffic
    profile setting ``hi``. Workloads without prefix reuse need no range (every row holds its none)."""
    out = {}
    for w in workloads:
        pc = w.prefix_cache
        if pc.hit_rate <= 0 or pc.working_set_gb <= 0:
            out[w.name] = (0.0, 0.0)
            continue
        ws = pc.working_set_gb * GB
        least = min((v for v in (w.profile or w.months or ()) if v > 0), default=w.requests_per_s)
        out[w.name] = (ws / w.requests_per_s * low, ws / least * high)
    return out


def usable_share(pcap, rate, share: tuple[float, float] | None) -> np.ndarray:
    """Rows' prefix bytes per request/s as pruning compares them, for a ``working_set / demand`` anywhere in
    ``share = (lo, hi)``: at most ``hi`` (a row above it is usable wherever a row at ``hi`` is), and -1 for a
    row below ``lo`` (usable nowhere in the range: it dominates no usable row). ``None``: any range."""
    q = np.maximum(np.asarray(rate, dtype=float), 1e-300)
    v = np.asarray(pcap, dtype=float) / q
    if share is None:
        return v
    lo, hi = share
    return np.where(v >= lo * (1 - 1e-9), np.minimum(v, hi), -1.0)
