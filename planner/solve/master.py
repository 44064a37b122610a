"""An exact master over the blocks' slot vectors: a proof of optimality where branch and bound is slow.

After the block floors (:mod:`planner.solve.floors`) a deployment MILP's LP bound sits at the sum of its blocks'
floors, and what is left to prove is how the blocks' replicas add up to whole purchase units: on the ten-workload
fleet the floors add to $771.11/h, the optimum is $775.68/h, and HiGHS spends seconds per re-solve closing the
$4.57/h. This module closes it by enumeration instead.

A block (a workload) reaches the rest of the model only through *linking rows* it can only fill (unit packing:
``sum slots x <= chips u``). Its *slot vector* is what it puts on each; its cost is a price per slot of each row.
Every plan of objective at most ``C`` gives block ``b`` a cost within its window ``U_b = C - sum_{b' != b} Z_b'``
(the floors ``Z``), so it puts on the linking rows at least one of the block's *Pareto-minimal* slot vectors of
cost at most ``U_b``: moving the block to that vector's assignment keeps every linking row and costs no more. So the
master, which picks per block one of those assignments (or keeps it where a known plan has it) and sets the
other columns anew (:func:`planner.solve.floors.choose`), has an optimum no plan of objective at most ``C`` beats: its
dual bound, or ``C`` where it is lower, is a lower bound on the whole MILP.

The vectors are enumerated from the block's rows, not by a MILP per box of slot counts: each block must be a
*cover* (declared by the model, checked here on HiGHS's rows):

- one demand row ``sum_s c_s s >= D`` over its stream columns ``s`` (continuous);
- per stream, one or more stage rows ``sum_j rho_j x_j - c_{s,k} s >= 0`` (a stream serves at most what its
  slowest stage carries: aggregated pools are one stage, disaggregated prefill and decode two);
- each replica column ``x_j`` integer, in one stage row and one linking row (with a whole number of slots), its
  cost the linking row's price times its slots; no other columns.

At most one stream may have two or more stages. Per stage and linking row the most rate in ``n`` slots is a bounded
knapsack (one table per pair); the single-stage streams' rates add up, and the multi-stage stream's stages must each
cover what they leave. The enumeration walks the linking rows in order over the tables' breakpoints, pruned by the
exact least cost of what is left (staircases of the tables' Pareto-best cost and rate sums), and one Pareto filter
over all candidates keeps the minimal vectors. ``tests/test_block_master.py`` checks them against brute-force
enumeration of replicas; ``bench/bench_projections.py --reference`` against a MILP per box of slot counts.

The master: where every linking row is ``slots <= chips x units`` with the units priced at the slots' price, a
plan's cost is its blocks' plus the price of the chips its rows leave idle, which depends on each row's total modulo
its chips only, so a dynamic programme over the blocks with those residues as its state is the master
(:func:`_residues`, milliseconds); its plan is checked on the model, and where another row breaks it the MILP master
runs (:func:`planner.solve.floors.choose`, one binary per vector).

Windows are tried narrow first (``C' = sum Z + delta``, ``delta`` doubling up to the known plan's ``C``): if the
master's plan costs at most ``C'``, no plan is cheaper and the proof is done with few vectors; else ``C'`` itself is
a lower bound and the window widens. It gives up (returns what it has proven) when a block's vectors exceed
:data:`MAX_VECTORS`, time runs out, or the last windows' growth says the next would not end in time.
Knows nothing of the physics: only rows, columns and the covers the model declares.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from planner.solve.floors import Floors, Lp, choose, objective_of
from planner.solve.vectors import FEAS_TOL, MAX_CANDIDATES, Shape, TooMany, vectors  # noqa: F401  (vectors: re-exported)

MAX_VECTORS = 4000
"""Most Pareto-minimal slot vectors one block may have in a window before the master is not tried (the MILP master,
one binary per vector, would be slower than HiGHS's own search)."""


FIRST_WINDOW = 0.0025
"""The first window's width as a share of the floors' sum (then doubled): a plan known to be far from the optimum
(a greedy one) would otherwise open windows of too many vectors at once."""

MAX_PAIRS = 20_000_000
"""Most (state, vector) pairs one step of the residue master may weigh before the MILP master is used instead."""

MAX_STATES = 300_000
"""Most states (row totals modulo their units) the residue master may keep."""

MASTER_GAP_SHARE = 0.5
"""The master's relative gap as a share of the solve's: its bound then leaves HiGHS's re-check of the plan within
the solve's gap."""

MASTER_TIME_LIMIT_S = 2.0
"""Time limit of one master MILP."""

TOTAL_TIME_LIMIT_S = 4.0
"""Time limit of one proof (enumerations and masters, all windows)."""



@dataclass
class Cover:
    """One block's cover structure in HiGHS's indices: its demand row, and per stream its column and stage rows."""

    demand_row: int
    streams: list[tuple[int, list[int]]]






class _Index:
    """The entries of the model HiGHS holds by row and by column (built once per proof, for every block)."""

    def __init__(self, lp: Lp):
        self.lp = lp
        self.by_row: dict[int, list[tuple[int, float]]] = {}
        self.by_col: dict[int, list[tuple[int, float]]] = {}
        for r, j, v in zip(lp.rows.tolist(), lp.cols.tolist(), lp.vals.tolist(), strict=True):
            self.by_row.setdefault(r, []).append((j, v))
            self.by_col.setdefault(j, []).append((r, v))

    def ge(self, r: int) -> tuple[float, dict[int, float]] | None:
        """Row ``r`` as ``sum entries >= lower``: (lower, column -> coefficient), or ``None`` (two-sided or free)."""
        lo, hi = self.lp.rlo[r], self.lp.rhi[r]
        if np.isfinite(lo) and not np.isfinite(hi):
            return lo, dict(self.by_row.get(r, []))
        if np.isfinite(hi) and not np.isfinite(lo):
            return -hi, {j: -v for j, v in self.by_row.get(r, [])}
        return None

    def le(self, r: int) -> tuple[float, dict[int, float]] | None:
        """Row ``r`` as ``sum entries <= upper``, or ``None`` (two-sided or free)."""
        row = self.ge(r)
        return None if row is None else (-row[0], {j: -v for j, v in row[1].items()})


def shape(lp: Lp, idx: np.ndarray, cost: np.ndarray, cover: Cover, index: _Index | None = None) -> Shape | str:
    """``cover`` checked on ``lp`` for the block of columns ``idx`` and block cost ``cost``; a reason where it is
    not a cover this module can enumerate. ``index``: :class:`_Index` of ``lp``, where the caller has one."""
    index = index or _Index(lp)
    inside = np.zeros(lp.ncol, dtype=bool)
    inside[idx] = True
    col_cost = np.zeros(lp.ncol)
    col_cost[idx] = cost
    by_col, ge, le = index.by_col, index.ge, index.le

    demand = ge(cover.demand_row)
    if demand is None:
        return "the demand row is not one-sided"
    stream_cols = {s for s, _ in cover.streams}
    demand_entries = demand[1]
    if set(demand_entries) - stream_cols or any(v <= 0 for v in demand_entries.values()):
        return "the demand row holds more than the streams"
    stage_rows: dict[int, tuple[int, int]] = {}  # row -> (stage, stream column)
    stage_sign: dict[int, float] = {}  # +1 where the row reads ">=", -1 where HiGHS holds it as "<="
    streams, multi = [], 0
    for s, rows in cover.streams:
        if not inside[s] or lp.integer[s] != 0 or lp.clo[s] != 0:
            return "a stream column that is not a continuous block column from 0"
        if lp.chi[s] == 0 or s not in demand_entries:
            continue  # a stream fixed at 0 (no rows of that kind) serves nothing
        if np.isfinite(lp.chi[s]) or not rows:
            return "a stream with an upper bound or no stages"
        if {r for r, _ in by_col.get(s, [])} != {cover.demand_row, *rows}:
            return "a stream in rows other than the demand row and its stages"
        stages = []
        for r in rows:
            row = ge(r)
            entry = None if row is None else row[1].get(s)
            if entry is None or entry >= 0 or row[0] != 0:
                return "a stage row that is not 'capacity - c stream >= 0'"
            stage_rows[r] = (len(stage_rows), s)
            stage_sign[r] = 1.0 if np.isfinite(lp.rlo[r]) else -1.0
            stages.append((stage_rows[r][0], -entry))
        multi += len(stages) > 1
        streams.append((s, stages, demand_entries[s]))
    if multi > 1:
        return "more than one stream with several stages"
    nstage = len(stage_rows)

    links: dict[int, int] = {}
    price: list[tuple[float, float]] = []  # per linking row: block cost and objective per slot
    items_flat = []
    for j in idx.tolist():
        if j in stream_cols or lp.chi[j] == 0:
            continue  # a replica the bounds rule out is no item
        if lp.integer[j] == 0 or lp.clo[j] != 0:
            return "a block column that is neither a stream nor an integer replica from 0"
        entries = by_col.get(j, [])
        stage = [(r, v) for r, v in entries if r in stage_rows]
        other = [r for r, _ in entries if r not in stage_rows]
        if len(stage) != 1 or len(other) != 1:
            return "a replica not in exactly one stage row and one linking row"
        (sr, rate), lr = stage[0], other[0]
        rate *= stage_sign[sr]
        row = le(lr)
        if rate <= 0 or row is None:
            return "a replica with no rate in its stage, or a two-sided linking row"
        slots = row[1][j]
        if slots <= 0 or abs(slots - round(slots)) > 1e-9:
            return "a linking row the block can empty as well as fill, or slots that are not whole"
        pair = (col_cost[j] / slots, lp.cost[j] / slots)
        if pair[0] <= 0 or pair[1] < 0:
            return "a price per slot that is not positive (no window would bound the block's slots)"
        if lr not in links:
            links[lr] = len(links)
            price.append(pair)
        if not np.allclose(price[links[lr]], pair, rtol=1e-9, atol=1e-15):
            return "a cost that is not a price per slot of its linking row"
        items_flat.append((stage_rows[sr][0], links[lr], j, int(round(slots)), rate, lp.chi[j]))
    if any(lp.cost[j] != 0 or col_cost[j] != 0 for j in stream_cols):
        return "a stream with a cost"
    link_rows = np.array(sorted(links, key=links.get), dtype=np.int64)
    # the most the block may put on each linking row: its bound less the least the other columns put there
    room = []
    for r in link_rows:
        upper, entries = le(r)
        least = sum(v * (lp.clo[j] if v > 0 else lp.chi[j]) for j, v in entries.items() if not inside[j])
        room.append(upper - least if np.isfinite(least) else np.inf)
    # rates in the demand row's units: stage k of stream s carries rate * c_s / c_sk of demand
    scale = {k: c_s / c_sk for _, stages, c_s in streams for k, c_sk in stages}
    items = [[[] for _ in links] for _ in range(nstage)]
    for k, lk, j, slots, rate, most in items_flat:
        if k in scale:
            items[k][lk].append((j, slots, rate * scale[k], most))
    free = [k for _, stages, _ in streams if len(stages) == 1 for k, _ in stages]
    cover_stages = [k for _, stages, _ in streams if len(stages) > 1 for k, _ in stages]
    return Shape(idx, link_rows, np.asarray([p for p, _ in price]), np.asarray([o for _, o in price]),
                  np.asarray(room, dtype=float), float(lp.rlo[cover.demand_row]),
                  free, cover_stages, items, streams)






















@dataclass
class Proof:
    x: np.ndarray
    """The best plan found (a vector over the columns of :attr:`planner.solve.floors.Floors.lp`)."""
    value: float
    """Its objective, checked on the model."""
    bound: float
    """A lower bound on every plan's objective."""
    vectors: int
    """Slot vectors in the last master."""
    wall_s: float
    levels: list[tuple[float, int, float, float, str, float]] = field(default_factory=list)
    """Per window tried: its level (the objective it admits plans up to), the slot vectors in it, the best plan's
    objective and the bound after it, and which master ran (``residues``, ``milp``; ``too many`` where the
    enumeration gave up, ``no time`` where the window was not tried: the last ones' growth said it would not end in
    the time left), and its seconds."""


def prove(floors: Floors, covers: list[Cover | None], start: np.ndarray, cutoff: float, *, threads: int,
          mip_gap: float, time_limit_s: float = TOTAL_TIME_LIMIT_S) -> Proof | None:
    """A lower bound on the model's objective from the master over the blocks' slot vectors, with the best plan it
    saw, or ``None`` where a block is not a cover, the model's objective does not cover the blocks, or nothing was
    proven in time. ``covers``: per block of ``floors.floors`` (same order), its cover; ``start``: a plan of
    objective ``cutoff``."""
    t0 = time.perf_counter()
    lp = floors.lp
    shapes, index = [], _Index(lp)
    for (_, idx, cost), cover in zip(floors.floors, covers, strict=True):
        if cover is None:
            return None
        sh = shape(lp, idx, cost, cover, index)
        if isinstance(sh, str):
            return None
        shapes.append(sh)
    units = _units(index, floors, shapes)
    total = floors.total
    width = cutoff - total
    if not np.isfinite(width):
        return None
    best_x, best_v, bound, used = start, cutoff, -np.inf, 0
    levels: list = []
    delta = max(min(width / 16.0, FIRST_WINDOW * max(1.0, abs(total))), 1e-6 * max(1.0, abs(cutoff)))
    deadline = t0 + time_limit_s
    took: list[float] = []  # seconds per window
    while True:
        level = min(total + delta, best_v)
        if took and not _worth_it(took, deadline - time.perf_counter()):
            levels.append((level, -1, best_v, bound, "no time", 0.0))
            break
        t_level = time.perf_counter()
        try:
            options, vecs = [], []
            for (z, _, _), sh in zip(floors.floors, shapes, strict=True):
                found = vectors(sh, level - (total - z) + 1e-9 * max(1.0, abs(level)), deadline=deadline)
                if len(found) > MAX_VECTORS:
                    raise TooMany
                option, vec = _as_options(sh, z, found)
                options.append(option)
                vecs.append(vec)
        except TooMany:
            levels.append((level, -1, best_v, bound, "too many", time.perf_counter() - t_level))
            break
        used = sum(len(o) for _, o in options)
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        got, master = None, "residues"
        if units is not None:
            # each block may also stay where the best plan has it (outside the window, it lowers no bound)
            kept = [_kept(sh, best_x, z) for (z, _, _), sh in zip(floors.floors, shapes, strict=True)]
            got = _residues(lp, best_x, units, floors, [v + [k[:2]] for v, k in zip(vecs, kept, strict=True)],
                            [(idx, o + [k[2]]) for (idx, o), k in zip(options, kept, strict=True)], level,
                            best_v, deadline)
        if got is None or not np.isfinite(got[1]):
            # no residue master here, or its plan breaks another row (inventory, power): the MILP
            dp_bound, master = None if got is None else got[2], "milp"
            got = choose(lp, best_x, [idx for _, idx, _ in floors.floors], options, threads=threads,
                         time_limit_s=min(MASTER_TIME_LIMIT_S, left), mip_gap=mip_gap * MASTER_GAP_SHARE)
            if got is not None and dp_bound is not None:
                got = (got[0], got[1], max(got[2], dp_bound))
        if got is not None:
            x, value, master_bound = got
            if value < best_v:
                best_x, best_v = x, value
            bound = max(bound, min(master_bound, level))
        took.append(time.perf_counter() - t_level)
        levels.append((level, used, best_v, bound, master, took[-1]))
        if best_v - bound <= mip_gap * max(1.0, abs(best_v)) or level >= best_v:
            break
        delta *= 2.0
    if not np.isfinite(bound):
        return None
    return Proof(best_x, best_v, bound, used, time.perf_counter() - t0, levels)


@dataclass
class _Units:
    """Where every linking row is ``sum slots x <= chips u`` with one integer unit column ``u`` priced at the block
    price of its slots times ``chips``: then a plan's units cost the blocks' costs plus the price of the chips its
    rows leave idle, which depends only on each row's total modulo ``chips``."""

    rows: np.ndarray  # the linking rows, one order for all blocks
    unit: np.ndarray  # the unit column of each
    chips: np.ndarray  # slots per unit
    price: np.ndarray  # block cost per slot
    where: list[np.ndarray]  # per block: the position of each of its linking rows in ``rows``


def _units(index: _Index, floors: Floors, shapes: list[Shape]) -> _Units | None:
    """The linking rows' units (:class:`_Units`), or ``None`` where a linking row is not of that form or a column on
    it belongs to no block of ``floors``."""
    lp = index.lp
    order: dict[int, int] = {}
    price: dict[int, float] = {}
    for sh in shapes:
        for r, p in zip(sh.links.tolist(), sh.price.tolist(), strict=True):
            order.setdefault(r, len(order))
            if not np.isclose(price.setdefault(r, p), p, rtol=1e-9, atol=1e-15):
                return None
    rows = np.array(list(order), dtype=np.int64)
    in_block = np.zeros(lp.ncol, dtype=bool)
    for _, idx, _ in floors.floors:
        in_block[idx] = True
    unit, chips = [], []
    for r in rows.tolist():
        row = index.le(r)
        if row is None or row[0] != 0:
            return None
        others = [(j, -v) for j, v in row[1].items() if not in_block[j]]
        if not others:  # its unit fixed at 0 (Pyomo left the column out): the blocks put nothing there
            unit.append(-1)
            chips.append(1)
            continue
        if len(others) != 1:
            return None
        (j, c), = others
        if lp.integer[j] == 0 or lp.clo[j] != 0 or c <= 0 or abs(c - round(c)) > 1e-9 or \
                not np.isclose(lp.cost[j], price[r] * c, rtol=1e-9, atol=1e-12):
            return None
        unit.append(j)
        chips.append(int(round(c)))
    where = [np.array([order[r] for r in sh.links.tolist()], dtype=np.int64) for sh in shapes]
    return _Units(rows, np.array(unit), np.array(chips), np.array([price[r] for r in rows.tolist()]), where)


def _residues(lp: Lp, start: np.ndarray, units: _Units, floors: Floors, vecs: list, options: list, level: float,
              best: float, deadline: float) -> tuple[np.ndarray, float, float] | None:
    """The master without HiGHS, where the linking rows are units (:class:`_Units`): a plan of objective at most
    ``level`` puts a total ``T_r`` on each row and pays at least ``sum_b (Z_b + excess_b) + sum_r price_r (-T_r mod
    chips_r)`` (its blocks' costs plus the idle chips), so a dynamic programme over the blocks, its state the
    totals modulo each row's chips, its value the least excess, gives the least of that over the vectors
    (``vecs``: per block, its vectors and what each adds to the objective beyond its floor (:func:`_above`); ``options``: their assignments). Returns the plan of that least (units
    rounded up, the rest as ``start``; its objective checked on the model: where another row breaks it, ``inf``) and
    the bound ``min(level, sum Z + least)``; ``None`` past ``deadline`` or :data:`MAX_STATES` states."""
    total = floors.total
    budget = best - total + 1e-9 * max(1.0, abs(best))  # a plan of excess and idle chips above this is no better
    chips = units.chips.astype(np.int64)
    stride = np.cumprod(np.concatenate([[1], chips[:-1]])).astype(np.int64)
    codes = np.zeros(1, dtype=np.int64)
    excess = np.zeros(1)
    back = []  # per block: (parent state, option) of each state
    order = sorted(range(len(vecs)), key=lambda b: len(vecs[b]))
    rest = np.concatenate([np.cumsum([min((e for _, e in vecs[b]), default=np.inf) for b in order][::-1])[::-1], [0.0]])
    for step, b in enumerate(order):
        if not vecs[b]:
            return start, np.inf, level  # a block with no vector in the window: no plan costs at most level
        res = np.zeros((len(vecs[b]), len(chips)), dtype=np.int64)
        for o, (v, _) in enumerate(vecs[b]):
            res[o, units.where[b]] += v
        res %= chips
        ex = np.array([e for _, e in vecs[b]])
        o_sort = np.argsort(ex, kind="stable")
        ex, res = ex[o_sort], res[o_sort]
        # the pairs (state, option) within the budget, the later blocks at their least
        room = budget - rest[step + 1] - excess
        count = np.searchsorted(ex, room, side="right")
        n = int(count.sum())
        if n > MAX_PAIRS or time.perf_counter() > deadline:
            return None
        si = np.repeat(np.arange(len(codes)), count)
        oi = np.arange(n) - np.repeat(np.cumsum(count) - count, count)
        state_res = (codes[:, None] // stride) % chips
        new = np.zeros(n, dtype=np.int64)
        for r in range(len(chips)):
            new += ((state_res[si, r] + res[oi, r]) % chips[r]) * stride[r]
        val = excess[si] + ex[oi]
        first = np.lexsort((val, new))
        keep = np.concatenate([[True], new[first][1:] != new[first][:-1]]) if n else np.zeros(0, dtype=bool)
        pick = first[keep]
        if len(pick) > MAX_STATES:
            return None
        codes, excess = new[pick], val[pick]
        back.append((b, si[pick], o_sort[oi[pick]]))
        if not len(codes):
            return start, np.inf, level
    state_res = (codes[:, None] // stride) % chips
    idle = ((-state_res) % chips) @ units.price
    value = excess + idle
    least = int(np.argmin(value))
    bound = min(level, total + float(value[least]))
    # the plan: each block's vector, the units rounded up
    x = start.copy()
    slots = np.zeros(len(chips), dtype=np.int64)
    s = least
    for b, parent, option in reversed(back):
        o = int(option[s])
        idx = floors.floors[b][1]
        x[idx] = options[b][1][o]
        slots[units.where[b]] += vecs[b][o][0]
        s = int(parent[s])
    has = units.unit >= 0
    x[units.unit[has]] = -(-slots[has] // chips[has])
    checked = objective_of(lp, x)
    return x, np.inf if checked is None else checked, bound


def _worth_it(took: list[float], left: float) -> bool:
    """Whether the next window (twice as wide) is likely to be done in the ``left`` seconds: its time predicted as
    the last one's times the last growth, at least 4x (a window's vectors grow several times per doubling). A
    master that would not end in time leaves HiGHS its time."""
    growth = max(4.0, took[-1] / took[-2]) if len(took) > 1 and took[-2] > 0 else 4.0
    return took[-1] * growth <= left


def _above(sh: Shape, vec: np.ndarray, floor: float) -> float:
    """What slot vector ``vec`` of the block adds to the objective beyond its floor: its cost above the floor (the
    units it fills) plus what the objective charges its replicas themselves (the deployment MILP's tie-break)."""
    return float(sh.price @ vec) - floor + float(sh.objective @ vec)


def _kept(sh: Shape, x: np.ndarray, floor: float) -> tuple[np.ndarray, float, np.ndarray]:
    """The block where plan ``x`` has it: its slot vector, its cost above ``floor``, its assignment."""
    vec = np.zeros(len(sh.links), dtype=np.int64)
    for per_link in sh.items:
        for lk, lst in enumerate(per_link):
            for j, slots, _, _ in lst:
                n = int(round(x[j]))
                vec[lk] += slots * n
    return vec, _above(sh, vec, floor), x[sh.idx].copy()


def _as_options(sh: Shape, floor: float, found: list[tuple[np.ndarray, dict]]) -> tuple[tuple, list]:
    """A block's vectors (:func:`vectors`) as the masters take them: ``(columns, [assignment as a vector over
    them])`` for :func:`planner.solve.floors.choose`, and ``[(slot vector, what it adds beyond the floor)]`` for
    :func:`_residues`."""
    pos = {int(j): i for i, j in enumerate(sh.idx.tolist())}
    dense = []
    for _, a in found:
        v = np.zeros(len(sh.idx))
        for j, val in a.items():
            v[pos[j]] = val
        dense.append(v)
    return (sh.idx, dense), [(vec, _above(sh, vec, floor)) for vec, _ in found]
