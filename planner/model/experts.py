"""Expert placement MILP (Pyomo): copies of each expert on GPUs, minimising the busiest GPU's load.

Decisions: ``y[e, g]`` binary (GPU ``g`` holds a copy of expert ``e``; two copies on one GPU would
be useless), ``f[e, g] >= 0`` (the share of expert ``e``'s tokens its copy on ``g`` serves; a
balancing router), ``Z`` (the busiest GPU's load). Loads are scaled so the mean GPU load is 1, so
``Z`` is the imbalance factor itself.

    sum_e y[e, g] = S                 every GPU fills its (E + R) / G slots
    sum_g y[e, g] >= 1                every expert has a copy
    sum_g f[e, g] = load[e]           every expert's tokens are served
    f[e, g] <= load[e] * y[e, g]      only by GPUs holding a copy
    sum_e f[e, g] <= Z                 the busiest GPU bounds the layer
    load(g) >= load(g + 1)            symmetry breaking (GPUs are interchangeable)

With ``placement`` given, ``y`` is fixed and the model is the LP that evaluates a placement under the
balancing router.
"""

from __future__ import annotations

import numpy as np
import pyomo.environ as pyo


def build_placement_model(load: np.ndarray, gpus: int, slots: int, *, placement: list[list[int]] | None = None,
                          upper: float | None = None) -> pyo.ConcreteModel:
    E = len(load)
    w = np.asarray(load, dtype=float) / float(np.sum(load)) * gpus  # mean GPU load = 1
    m = pyo.ConcreteModel(name="expert_placement")
    m.E = pyo.RangeSet(0, E - 1)
    m.G = pyo.RangeSet(0, gpus - 1)
    m.y = pyo.Var(m.E, m.G, within=pyo.Binary)
    m.f = pyo.Var(m.E, m.G, within=pyo.NonNegativeReals)
    m.Z = pyo.Var(within=pyo.NonNegativeReals, bounds=(1.0, upper))
    if placement is None:
        m.gpu_slots = pyo.Constraint(m.G, rule=lambda m, g: sum(m.y[e, g] for e in m.E) == slots)
    m.one_copy = pyo.Constraint(m.E, rule=lambda m, e: sum(m.y[e, g] for g in m.G) >= 1)
    m.served = pyo.Constraint(m.E, rule=lambda m, e: sum(m.f[e, g] for g in m.G) == float(w[e]))
    m.held = pyo.Constraint(m.E, m.G, rule=lambda m, e, g: m.f[e, g] <= float(w[e]) * m.y[e, g])
    m.gpu_load = pyo.Expression(m.G, rule=lambda m, g: sum(m.f[e, g] for e in m.E))
    m.busiest = pyo.Constraint(m.G, rule=lambda m, g: m.gpu_load[g] <= m.Z)
    if placement is None:
        m.order = pyo.Constraint(
            m.G, rule=lambda m, g: m.gpu_load[g] >= m.gpu_load[g + 1] if g + 1 < gpus else pyo.Constraint.Skip
        )
    else:
        for g, hold in enumerate(placement):
            for e in m.E:
                m.y[e, g].fix(1 if e in hold else 0)
    m.imbalance = pyo.Objective(expr=m.Z, sense=pyo.minimize)
    return m


def placement_from(m) -> list[list[int]]:
    return [[int(e) for e in m.E if (pyo.value(m.y[e, g]) or 0) > 0.5] for g in m.G]


def gpu_loads(m) -> np.ndarray:
    return np.array([pyo.value(m.gpu_load[g]) for g in m.G])
