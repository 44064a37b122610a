"""Expert placement end to end: loads -> greedy (EPLB) baseline -> MILP -> both reported side by side.

The MILP starts from the greedy placement's imbalance as an upper bound; if the solver's time limit
ends without a better incumbent, the greedy placement stands (reported as such, with the gap to the
solver's bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyomo.common.collections import ComponentMap

from planner.errors import InputError
from planner.model.experts import build_placement_model, placement_from
from planner.perf.experts import (
    even_split_loads,
    greedy_pack,
    greedy_replicas,
    imbalance,
    node_spread,
    replicas_of,
)
from planner.solve import Solver


@dataclass
class PlacementResult:
    experts: int
    gpus: int
    redundant: int
    placement: list[list[int]]
    imbalance: float
    """max / mean GPU load of the MILP placement under the balancing router (the objective)."""
    imbalance_even: float
    greedy_placement: list[list[int]]
    greedy_imbalance: float
    """Greedy placement under the balancing router (same assumption as ``imbalance``)."""
    greedy_imbalance_even: float
    solver: dict
    source: str
    """``milp`` or ``greedy`` (the solver found nothing better within its time limit)."""
    node_spread: float
    greedy_node_spread: float

    def to_json(self) -> dict:
        return {
            "experts": self.experts,
            "gpus": self.gpus,
            "redundant": self.redundant,
            "routing": "balanced: each expert's tokens split among its copies to even out GPU loads; "
            "*_even: split evenly among copies",
            "imbalance": self.imbalance,
            "imbalance_even": self.imbalance_even,
            "greedy_imbalance": self.greedy_imbalance,
            "greedy_imbalance_even": self.greedy_imbalance_even,
            "placement": self.placement,
            "replicas": {str(e): int(n) for e, n in enumerate(replicas_of(self.placement, self.experts))},
            "greedy_placement": self.greedy_placement,
            "node_spread": self.node_spread,
            "greedy_node_spread": self.greedy_node_spread,
            "solver": self.solver,
            "source": self.source,
        }


def check_shape(experts: int, gpus: int, redundant: int) -> int:
    if gpus < 1:
        raise InputError("--gpus: must be at least 1")
    if redundant < 0:
        raise InputError("--redundant: must be 0 or more")
    if (experts + redundant) % gpus:
        raise InputError(
            f"--gpus {gpus} does not divide experts + redundant = {experts} + {redundant}; "
            f"choose --redundant so that {experts} + R is a multiple of {gpus}"
        )
    if (experts + redundant) // gpus > experts:
        raise InputError("--redundant: more slots per GPU than experts; lower --redundant")
    return (experts + redundant) // gpus


def balanced_imbalance(load: np.ndarray, placement: list[list[int]], gpus: int, slots: int) -> float:
    """Imbalance of a fixed placement under the balancing router (an LP)."""
    m = build_placement_model(load, gpus, slots, placement=placement)
    res = Solver(mip_gap=0.0, time_limit_s=60).solve(m)
    if not res.has_solution:
        raise InputError("placement evaluation failed: an expert has no copy")
    return float(pyo_value(m.Z))


def _start(m, load, placement, gpus, slots) -> dict:
    """The greedy placement with its balanced-router split as a complete MIP start (GPUs sorted by
    load to satisfy the symmetry-breaking order)."""
    lp = build_placement_model(load, gpus, slots, placement=placement)
    Solver(mip_gap=0.0).solve(lp)
    order = sorted(range(gpus), key=lambda g: -pyo_value(lp.gpu_load[g]))
    start = ComponentMap()
    start[m.Z] = pyo_value(lp.Z)
    for new, old in enumerate(order):
        for e in m.E:
            start[m.y[e, new]] = 1.0 if e in placement[old] else 0.0
            start[m.f[e, new]] = max(pyo_value(lp.f[e, old]), 0.0)
    return start


def pyo_value(v) -> float:
    import pyomo.environ as pyo

    return float(pyo.value(v))


def place_experts(load: np.ndarray, gpus: int, redundant: int, *, gpus_per_node: int = 8,
                  time_limit_s: float = 10.0, mip_gap: float = 1e-4) -> PlacementResult:
    load = np.asarray(load, dtype=float)
    E = len(load)
    slots = check_shape(E, gpus, redundant)
    greedy = greedy_pack(load, greedy_replicas(load, redundant), gpus)
    g_bal = balanced_imbalance(load, greedy, gpus, slots)
    g_even = imbalance(even_split_loads(load, greedy))
    m = build_placement_model(load, gpus, slots)
    res = Solver(time_limit_s=time_limit_s, mip_gap=mip_gap).solve(m, start=_start(m, load, greedy, gpus, slots))
    if res.has_solution and res.objective is not None and res.objective < g_bal - 1e-9:
        placement = placement_from(m)
        bal = float(res.objective)
        source = "milp"
        if not all(placement):
            raise RuntimeError("MILP returned a GPU without experts")
    else:
        placement, bal, source = greedy, g_bal, "greedy"
    bound = res.bound if res.bound is not None else 1.0
    gap = max(bal - bound, 0.0) / bal
    status = "optimal" if gap <= mip_gap + 1e-12 else "feasible"
    return PlacementResult(
        experts=E, gpus=gpus, redundant=redundant, placement=placement, imbalance=bal,
        imbalance_even=imbalance(even_split_loads(load, placement)), greedy_placement=greedy,
        greedy_imbalance=g_bal, greedy_imbalance_even=g_even,
        solver={"status": status, "termination": res.termination, "mip_gap": gap, "bound": bound, "wall_s": res.wall_s},
        source=source, node_spread=node_spread(placement, gpus_per_node, E),
        greedy_node_spread=node_spread(greedy, gpus_per_node, E),
    )
