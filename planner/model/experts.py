"""Expert placement models (Pyomo): copies of each expert on GPUs, minimising the busiest GPU's load.

Loads are in units of the mean GPU load (``w[e] = load share x G``), so ``Z`` (the busiest GPU's
load) is the imbalance factor itself. Two routing assumptions (see ``planner.perf.experts``):

**Even split** (:func:`build_repack_model`; what ``planner experts`` minimises): vLLM and SGLang send
a token to one copy of its expert chosen pseudo-randomly, so each of an expert's ``k`` copies carries
``w[e] / k``. The model places the copies held by a set ``F`` of GPUs (all GPUs for the full problem,
a few for a large-neighbourhood step) and may change the copy count of every expert whose copies all
lie in ``F``; an expert with copies outside ``F`` may change its count too (the copies outside stay,
their share changes, and the loads of those GPUs enter the max). Decisions: ``x[e, o]`` binary (expert ``e`` takes copy-count option ``o``: ``k`` copies
in total, ``c`` of them in ``F``), ``y[e, g]`` binary (GPU ``g`` holds a copy of ``e``; two copies on
one GPU would be useless) and (for experts with several
options, ``z[e, o, g] = y[e, g] and x[e, o]``; otherwise the load is ``w[e] / k * y[e, g]``).

    sum_o x[e, o] = 1                                 one copy count per expert
    sum_g y[e, g] = sum_o c_o x[e, o]                 that many GPUs of F hold it
    sum_e y[e, g] = S                                 every GPU fills its (E + R) / G slots
    sum_o z[e, o, g] = y[e, g],  sum_g z[e, o, g] = c_o x[e, o]     (disaggregated: tight LP)
    load(g) = sum_{e, o} w[e] / k_o * z[e, o, g] <= Z   the busiest GPU bounds the layer
    minimise Z + eps * sum_{e, n} u[e, n],  u[e, n] >= y[e, g] (g on node n)   node-spread tie-break

The node-spread term keeps an expert's copies on few nodes (a node-limited router that sends each
token to at most M nodes then finds more of its experts in nodes it already reaches); its weight is
far below any imbalance difference of interest.

**Balancing router** (:func:`build_balanced_model`): a dispatcher that splits each expert's tokens
among its copies to even out GPU loads (the best any router can do for a placement); an LP over the
continuous shares ``f[e, g]`` of a given placement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyomo.core as pyo

NODE_SPREAD_WEIGHT = 1e-5
"""Weight of the node-spread tie-break per (expert, node) pair; a few hundred pairs stay ~1e-3 below
any imbalance difference that matters."""


@dataclass(frozen=True)
class RepackExpert:
    """One expert of a repack sub-problem: its load (mean GPU = 1) and copy-count options, each
    ``(total copies k, copies inside F c)``."""

    expert: int
    weight: float
    options: tuple[tuple[int, int], ...]


def build_repack_model(experts: list[RepackExpert], gpus: list[int], slots: int, *,
                       node_of: dict[int, int] | None = None,
                       outside: dict[int, tuple[float, list[tuple[int, int]]]] | None = None,
                       order: bool = False) -> pyo.ConcreteModel:
    """Place the copies of ``experts`` on ``gpus`` (see module docstring).

    ``outside`` maps a GPU outside ``F`` to its current load and the (expert, current copies) it
    holds among ``experts``: a changed copy count changes those GPUs' loads too, linearly in ``x``.
    """
    m = pyo.ConcreteModel(name="expert_repack")
    by_id = {x.expert: x for x in experts}
    m.E = pyo.Set(initialize=[x.expert for x in experts])
    m.G = pyo.Set(initialize=list(gpus))
    m.EO = pyo.Set(initialize=[(x.expert, o) for x in experts for o in range(len(x.options))], dimen=2)
    multi = [x.expert for x in experts if len(x.options) > 1]
    m.M = pyo.Set(initialize=multi)
    m.x = pyo.Var(m.EO, within=pyo.Binary)
    m.y = pyo.Var(m.E, m.G, within=pyo.Binary)
    m.MO = pyo.Set(initialize=[(e, o) for e in multi for o in range(len(by_id[e].options))], dimen=2)
    m.z = pyo.Var(m.MO, m.G, within=pyo.Binary)
    m.Z = pyo.Var(within=pyo.NonNegativeReals)

    m.one_option = pyo.Constraint(m.E, rule=lambda m, e: sum(m.x[e, o] for o in range(len(by_id[e].options))) == 1)
    m.copies = pyo.Constraint(
        m.E,
        rule=lambda m, e: sum(m.y[e, g] for g in m.G)
        == sum(c * m.x[e, o] for o, (_, c) in enumerate(by_id[e].options)),
    )
    m.gpu_slots = pyo.Constraint(m.G, rule=lambda m, g: sum(m.y[e, g] for e in m.E) == slots)
    # disaggregated copies: z[e, o, g] = y[e, g] and x[e, o] (tighter than big-M on the shares)
    m.pick = pyo.Constraint(
        m.M, m.G, rule=lambda m, e, g: sum(m.z[e, o, g] for o in range(len(by_id[e].options))) == m.y[e, g]
    )
    m.per_option = pyo.Constraint(
        m.MO, rule=lambda m, e, o: sum(m.z[e, o, g] for g in m.G) == by_id[e].options[o][1] * m.x[e, o]
    )

    def gpu_load(m, g):
        fixed = sum(x.weight / x.options[0][0] * m.y[x.expert, g] for x in experts if len(x.options) == 1)
        return fixed + sum(by_id[e].weight / by_id[e].options[o][0] * m.z[e, o, g] for e, o in m.MO)

    m.gpu_load = pyo.Expression(m.G, rule=gpu_load)
    m.busiest = pyo.Constraint(m.G, rule=lambda m, g: m.gpu_load[g] <= m.Z)
    if order:  # GPUs interchangeable (no node term): loads in descending order
        gl = list(gpus)
        m.order = pyo.Constraint(range(len(gl) - 1), rule=lambda m, i: m.gpu_load[gl[i]] >= m.gpu_load[gl[i + 1]])
    outside = {h: v for h, v in (outside or {}).items() if any(len(by_id[e].options) > 1 for e, _ in v[1])}

    def outside_load(m, h):
        base, held = outside[h]
        return base + sum(
            (by_id[e].weight / k - by_id[e].weight / n) * m.x[e, o]
            for e, n in held
            for o, (k, _) in enumerate(by_id[e].options)
            if k != n
        ) <= m.Z

    m.H = pyo.Set(initialize=sorted(outside))
    m.outside_busiest = pyo.Constraint(m.H, rule=outside_load)
    spread = 0.0
    if node_of is not None:
        nodes = sorted({node_of[g] for g in gpus})
        if len(nodes) > 1:
            m.N = pyo.Set(initialize=nodes)
            m.u = pyo.Var(m.E, m.N, within=pyo.NonNegativeReals, bounds=(0.0, 1.0))
            m.on_node = pyo.Constraint(m.E, m.G, rule=lambda m, e, g: m.u[e, node_of[g]] >= m.y[e, g])
            spread = NODE_SPREAD_WEIGHT * sum(m.u[e, n] for e in m.E for n in m.N)
    m.objective = pyo.Objective(expr=m.Z + spread, sense=pyo.minimize)
    m._experts = by_id
    m._node_of = node_of
    m._outside_max = max((v[0] for v in outside.values()), default=0.0)
    return m


def repack_start(m, held: dict[int, list[int]], copies: dict[int, int]):
    """A complete MIP start from the current placement of the sub-problem's GPUs."""
    from pyomo.common.collections import ComponentMap

    start = ComponentMap()
    loads = {g: 0.0 for g in m.G}
    for g in m.G:
        hold = set(held[g])
        for e in m.E:
            start[m.y[e, g]] = 1.0 if e in hold else 0.0
    for e, x in m._experts.items():
        k = copies[e]
        opt = next(o for o, (kk, _) in enumerate(x.options) if kk == k)
        for o in range(len(x.options)):
            start[m.x[e, o]] = 1.0 if o == opt else 0.0
        for g in m.G:
            share = x.weight / k if e in held[g] else 0.0
            loads[g] += share
            if e in m.M:
                for o in range(len(x.options)):
                    start[m.z[e, o, g]] = 1.0 if (o == opt and e in held[g]) else 0.0
    start[m.Z] = max(max(loads.values()), getattr(m, "_outside_max", 0.0))
    if hasattr(m, "u"):
        for e in m.E:
            for n in m.N:
                start[m.u[e, n]] = 0.0
        for g in m.G:
            for e in held[g]:
                start[m.u[e, m._node_of[g]]] = 1.0
    return start


def repacked(m) -> tuple[dict[int, list[int]], dict[int, int]]:
    """The sub-problem's placement (GPU -> experts) and the chosen total copy counts."""
    held = {g: sorted(int(e) for e in m.E if (pyo.value(m.y[e, g]) or 0) > 0.5) for g in m.G}
    counts = {}
    for e, x in m._experts.items():
        o = max(range(len(x.options)), key=lambda o: pyo.value(m.x[e, o]) or 0.0)
        counts[e] = x.options[o][0]
    return held, counts


def build_balanced_model(load: np.ndarray, placement: list[list[int]]) -> pyo.ConcreteModel:
    """The LP that evaluates a placement under the balancing router: ``f[e, g]`` (share of expert
    ``e``'s tokens served by its copy on ``g``) over the pairs the placement holds; ``Z`` the busiest
    GPU's load (mean GPU load = 1)."""
    gpus = len(placement)
    w = np.asarray(load, dtype=float) / float(np.sum(load)) * gpus
    pairs = [(e, g) for g, hold in enumerate(placement) for e in hold]
    m = pyo.ConcreteModel(name="expert_placement_balanced")
    m.P = pyo.Set(initialize=pairs, dimen=2)
    m.f = pyo.Var(m.P, within=pyo.NonNegativeReals)
    m.Z = pyo.Var(within=pyo.NonNegativeReals)
    copies: dict[int, list[int]] = {}
    for e, g in pairs:
        copies.setdefault(e, []).append(g)
    m.served = pyo.Constraint(list(copies), rule=lambda m, e: sum(m.f[e, g] for g in copies[e]) == float(w[e]))
    m.busiest = pyo.Constraint(
        range(gpus), rule=lambda m, g: sum(m.f[e, g] for e in placement[g]) <= m.Z if placement[g] else pyo.Constraint.Skip
    )
    m.imbalance = pyo.Objective(expr=m.Z, sense=pyo.minimize)
    return m
