"""Expert placement end to end: loads -> greedy (EPLB) baseline -> MILP -> both side by side.

Objective: the busiest GPU's load under **even split** (a token goes to one copy of its expert
chosen pseudo-randomly, which is what vLLM's and SGLang's EPLB dispatch does). Every result also
reports the imbalance under a **balancing router** (each expert's tokens split among its copies to
even out GPU loads, the best any dispatcher could do for that placement; an LP).

Up to ``EXACT_MAX_GPUS`` GPUs the whole problem is one MILP (copy counts and assignment) solved to
a proven optimum. Beyond, a flat MILP over 64 GPUs x 256 experts gives HiGHS an LP bound of 1.0 and
no better incumbent than greedy in minutes (measured), so we run large-neighbourhood search: exact
sub-MILPs over a few GPUs at a time, each warm-started from the current placement. The reported gap
is then against perfect balance (mean GPU load), a valid bound for every placement.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pyomo.core as pyo

from planner.errors import InputError
from planner.model.experts import (
    RepackExpert,
    build_balanced_model,
    build_repack_model,
    repack_start,
    repacked,
)
from planner.perf.experts import (
    even_split_loads,
    expert_copy_bytes,
    greedy_pack,
    greedy_replicas,
    imbalance,
    node_spread,
    replicas_of,
    swap_descent,
)
from planner.solve import Solver

ROUTING = (
    "imbalance: max / mean GPU load when each expert's tokens split evenly among its copies (vLLM and "
    "SGLang pick a copy pseudo-randomly); imbalance_balanced: the same placement under a router that "
    "splits each expert's tokens among its copies to even out GPU loads"
)


@dataclass
class PlacementResult:
    experts: int
    gpus: int
    redundant: int
    placement: list[list[int]]
    imbalance: float
    """max / mean GPU load of the placement under even split (the objective)."""
    imbalance_balanced: float | None
    greedy_placement: list[list[int]]
    greedy_imbalance: float
    greedy_imbalance_balanced: float | None
    solver: dict
    node_spread: float
    """Mean number of nodes an expert's copies span."""
    greedy_node_spread: float
    slots_per_gpu: int

    @property
    def replicas(self) -> np.ndarray:
        return replicas_of(self.placement, self.experts)

    def to_json(self) -> dict:
        return {
            "experts": self.experts,
            "gpus": self.gpus,
            "redundant_experts": self.redundant,
            "slots_per_gpu": self.slots_per_gpu,
            "routing": ROUTING,
            "imbalance": self.imbalance,
            "greedy_imbalance": self.greedy_imbalance,
            "imbalance_balanced": self.imbalance_balanced,
            "greedy_imbalance_balanced": self.greedy_imbalance_balanced,
            "placement": self.placement,
            "replicas": {str(e): int(n) for e, n in enumerate(self.replicas)},
            "greedy_placement": self.greedy_placement,
            "node_spread": self.node_spread,
            "greedy_node_spread": self.greedy_node_spread,
            "solver": self.solver,
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


def balanced_imbalance(load: np.ndarray, placement: list[list[int]], time_limit_s: float = 60.0) -> float | None:
    """Imbalance of a fixed placement under the balancing router (an LP); None when the LP does not
    finish within ``time_limit_s`` (very large groups under a short ``--time-limit``)."""
    if len(replicas_of(placement, len(load)).nonzero()[0]) < len(load):
        raise InputError("placement evaluation failed: an expert has no copy")
    if all(len(set(h)) == 1 for h in placement) and all(len(h) == 1 for h in placement):
        # one slot per GPU: the router can only split an expert among its own copies, evenly at best
        return imbalance(even_split_loads(load, placement))
    m = build_balanced_model(load, placement)
    res = Solver(mip_gap=0.0, time_limit_s=max(time_limit_s, 0.05)).solve(m)
    if res.status != "optimal":
        return None
    return float(pyo.value(m.Z))


EXACT_MAX_GPUS = 6
"""Up to this many GPUs (the large-neighbourhood step size) the whole problem (copy counts and assignment) is one MILP, solved to a
proven optimum; beyond, large-neighbourhood search with exact sub-MILPs (see :func:`improve`)."""


def _options(e: int, w: float, n: int, c: int, f: int, gpus: int, upper: float, width: int) -> RepackExpert:
    """Copy-count options of an expert with ``n`` copies, ``c`` of them among the ``f`` freed GPUs:
    totals within ``width`` of ``n`` that keep its copies outside, fit in ``F`` and can reach
    ``upper`` (``k >= w / upper``)."""
    out = n - c
    lo = max(1, n - width, out, math.ceil(w / upper - 1e-9))
    hi = min(n + width, gpus, out + f)
    ks = [k for k in range(lo, hi + 1)] or [n]
    if n not in ks:
        ks = sorted({*ks, n})
    return RepackExpert(e, w, tuple((k, k - out) for k in ks))


def improve(load: np.ndarray, placement: list[list[int]], *, time_limit_s: float, gpus_per_node: int | None = None,
            neighbourhood: int = 6, seed: int = 0, mip_gap: float = 1e-4,
            step_limit_s: float = 0.5, width: int = 2) -> tuple[list[list[int]], dict]:
    """Large-neighbourhood search: repeatedly free the copies on a few GPUs (the busiest, some of the
    least loaded, some at random), let an exact sub-MILP (:func:`build_repack_model`) re-place them
    and re-choose the copy counts of experts living only there, keep the result when it is no worse.
    Every step starts from the current placement, so the imbalance never rises. Stops at the time
    limit, at perfect balance, or after 40 steps without improvement."""
    t0 = time.perf_counter()
    G = len(placement)
    S = len(placement[0])
    w = np.asarray(load, dtype=float) / float(np.sum(load)) * G
    n = replicas_of(placement, len(load)).astype(int)
    deadline = t0 + time_limit_s
    placement = swap_descent(w / n, placement, deadline=deadline)
    held = {g: list(h) for g, h in enumerate(placement)}
    node_of = {g: g // gpus_per_node for g in range(G)} if gpus_per_node else None
    rng = np.random.default_rng(seed)

    def loads() -> np.ndarray:
        return np.array([sum(w[e] / n[e] for e in held[g]) for g in range(G)])

    cur = loads()
    best = float(cur.max())
    bound = lower_bound(w, G * S)
    steps = stall = 0
    f = min(neighbourhood, G)
    while time.perf_counter() - t0 < time_limit_s and (best - bound["bound"]) / best > mip_gap and stall < 40:
        order = [int(g) for g in np.argsort(-cur, kind="stable")]
        top, bottom = order[: f // 2], order[::-1][: f // 4]
        rest = [g for g in order if g not in top and g not in bottom]
        pick = rng.choice(len(rest), size=min(f - len(top) - len(bottom), len(rest)), replace=False)
        F = sorted({*top, *bottom, *(rest[i] for i in pick)})
        inF: dict[int, int] = {}
        for g in F:
            for e in held[g]:
                inF[e] = inF.get(e, 0) + 1
        top_load = float(cur.max())
        experts = [_options(e, float(w[e]), int(n[e]), c, len(F), G, top_load, width) for e, c in inF.items()]
        Fset = set(F)
        outside = {
            h: (float(cur[h]), [(e, int(n[e])) for e in held[h] if e in inF])
            for h in range(G)
            if h not in Fset and any(e in inF for e in held[h])
        }
        m = build_repack_model(experts, F, S, node_of=node_of, outside=outside)
        remaining = time_limit_s - (time.perf_counter() - t0)
        res = Solver(time_limit_s=max(min(step_limit_s, remaining), 0.1), mip_gap=1e-6).solve(
            m, start=repack_start(m, {g: held[g] for g in F}, {e: int(n[e]) for e in inF})
        )
        steps += 1
        if res.has_solution:
            new_held, counts = repacked(m)
            old = {g: list(held[g]) for g in range(G)}
            old_n = n.copy()
            for e, k in counts.items():
                n[e] = k
            for g in F:
                held[g] = new_held[g]
            new = loads()
            if new.max() > cur.max() + 1e-12:  # cannot happen with a feasible start; guard anyway
                held.update(old)
                n[:] = old_n
            else:
                held = dict(enumerate(swap_descent(w / n, [held[g] for g in range(G)], deadline=deadline)))
                cur = loads()
        stall = stall + 1 if cur.max() >= best - 1e-9 else 0
        best = min(best, float(cur.max()))
    wall = time.perf_counter() - t0
    out = [sorted(held[g]) for g in range(G)]
    return out, {"method": "large-neighbourhood search with exact sub-MILPs", "steps": steps, "wall_s": wall,
                 **bound}


def lower_bound(w: np.ndarray, copies: int) -> dict:
    """A bound every placement obeys: the mean GPU load (1), and the heaviest copy, which is at least
    the smallest possible largest load per copy over all copy counts summing to ``copies`` (EPLB's
    replication rule attains that minimum)."""
    n = greedy_replicas(w, copies - len(w))
    heaviest = float(np.max(w / n))
    if heaviest > 1.0:
        return {"bound": heaviest, "bound_note": "heaviest copy under the best possible copy counts"}
    return {"bound": 1.0, "bound_note": "perfect balance (mean GPU load)"}


def solve_exact(load: np.ndarray, placement: list[list[int]], *, time_limit_s: float, mip_gap: float,
                gpus_per_node: int | None = None) -> tuple[list[list[int]], dict]:
    """The whole problem as one MILP: copy counts (exactly pruned by the incumbent) and assignment."""
    G = len(placement)
    S = len(placement[0])
    w = np.asarray(load, dtype=float) / float(np.sum(load)) * G
    n = replicas_of(placement, len(load))
    placement = swap_descent(w / n, placement)
    upper = imbalance(even_split_loads(load, placement))
    ranges = copy_ranges(w, G, G * S, upper)
    if not ranges or any(int(n[e]) not in ranges[e] for e in range(len(load))):
        ranges = [sorted(set(r) | {int(n[e])}) for e, r in enumerate(ranges or [[int(c)] for c in n])]
    experts = [RepackExpert(e, float(w[e]), tuple((k, k) for k in ranges[e])) for e in range(len(load))]
    node_of = {g: g // gpus_per_node for g in range(G)} if gpus_per_node else None
    m = build_repack_model(experts, list(range(G)), S, node_of=node_of, order=node_of is None)
    loads = even_split_loads(load, placement)
    by_load = [placement[g] for g in np.argsort(-loads, kind="stable")]  # the start obeys the order
    res = Solver(time_limit_s=time_limit_s, mip_gap=mip_gap).solve(
        m, start=repack_start(m, dict(enumerate(by_load)), {e: int(n[e]) for e in range(len(load))})
    )
    held, _ = repacked(m)
    out = [held[g] for g in range(G)]
    lb = lower_bound(w, G * S)
    if res.bound is not None and res.bound > lb["bound"]:
        lb = {"bound": float(res.bound), "bound_note": "solver bound"}
    return out, {"method": "one MILP (copy counts and assignment)", "steps": 1, "wall_s": res.wall_s,
                 "termination": res.termination, **lb}


def copy_ranges(w: np.ndarray, gpus: int, slots_total: int, upper: float) -> list[list[int]]:
    """Copy counts per expert that can reach imbalance ``<= upper`` (exact pruning): ``k >=
    ceil(w / upper)``, and at most the minimum plus the slots the minima leave free (and ``<= G``)."""
    lb = [max(1, math.ceil(float(x) / upper - 1e-9)) for x in w]
    free = slots_total - sum(lb)
    if free < 0:
        return []
    return [list(range(lo, min(lo + free, gpus) + 1)) for lo in lb]


def place_experts(load: np.ndarray, gpus: int, redundant: int, *, gpus_per_node: int = 8,
                  time_limit_s: float = 10.0, mip_gap: float = 1e-4, seed: int = 0) -> PlacementResult:
    """Greedy (EPLB) baseline, then the MILP (exact up to 8 GPUs, large-neighbourhood search beyond)
    from the greedy placement; both reported under both routing assumptions."""
    t0 = time.perf_counter()
    load = np.asarray(load, dtype=float)
    E = len(load)
    check_shape(E, gpus, redundant)
    slots = (E + redundant) // gpus
    greedy = greedy_pack(load, greedy_replicas(load, redundant), gpus)
    g_even = imbalance(even_split_loads(load, greedy))
    gpn = gpus_per_node if gpus > gpus_per_node else None
    if gpus <= EXACT_MAX_GPUS:
        placement, info = solve_exact(load, greedy, time_limit_s=time_limit_s, mip_gap=mip_gap, gpus_per_node=gpn)
    else:
        # leave time for the two balanced-router LPs (~0.2 s each at 256 x 64)
        budget = max(time_limit_s - (time.perf_counter() - t0) - min(0.6, 0.2 * time_limit_s), 0.05)
        placement, info = improve(load, greedy, time_limit_s=budget, gpus_per_node=gpn, seed=seed, mip_gap=mip_gap)
    even = imbalance(even_split_loads(load, placement))
    if even > g_even + 1e-12:  # the search starts from greedy and never worsens; keep the guard honest
        placement, even = greedy, g_even
    gap = max(even - info["bound"], 0.0) / even
    status = "optimal" if gap <= mip_gap + 1e-12 else "feasible"
    left = time_limit_s - (time.perf_counter() - t0)
    bal = balanced_imbalance(load, placement, left / 2) if left > 0.05 else None
    left = time_limit_s - (time.perf_counter() - t0)
    g_bal = balanced_imbalance(load, greedy, left) if left > 0.05 else None
    return PlacementResult(
        experts=E, gpus=gpus, redundant=redundant, placement=placement, imbalance=even,
        imbalance_balanced=bal,
        greedy_placement=greedy, greedy_imbalance=g_even,
        greedy_imbalance_balanced=g_bal,
        solver={"status": status, "mip_gap": gap, "bound": info["bound"], "wall_s": time.perf_counter() - t0,
                **{k: v for k, v in info.items() if k not in ("bound", "wall_s")}},
        node_spread=node_spread(placement, gpus_per_node, E),
        greedy_node_spread=node_spread(greedy, gpus_per_node, E),
        slots_per_gpu=slots,
    )


# --------------------------------------------------------------------------------------------------
# Several layers, redundancy choice, memory, the placement map
# --------------------------------------------------------------------------------------------------


def resident_bytes_per_gpu(model, gpus: int, slots: int, weights: str | None = None) -> float:
    """Weights one GPU of an expert-parallel group holds: its ``slots`` expert copies of every MoE
    layer, plus the non-expert weights (replicated on every GPU: attention data parallel)."""
    from planner.perf.params import resolve_dtypes, weight_bytes

    dense, expert = resolve_dtypes(model, weights)
    wb = weight_bytes(model, dense, expert)
    return wb.nonexpert + wb.embed + wb.lm_head + slots * expert_copy_bytes(model, weights)


def check_memory(model, hw, gpus: int, redundant: int, weights: str | None = None,
                 max_weight_fraction: float = 0.9) -> None:
    """Bad input: weights with ``redundant`` extra copies leave no room on the GPU."""
    slots = (model.architecture.moe.experts + redundant) // gpus
    need = resident_bytes_per_gpu(model, gpus, slots, weights)
    cap = hw.hbm_bytes * max_weight_fraction
    if need > cap:
        raise InputError(
            f"--redundant {redundant}: {slots} expert slots per GPU need {need / 1e9:.1f} GB of weights per GPU, "
            f"more than {max_weight_fraction:.0%} of {hw.id}'s {hw.hbm_bytes / 1e9:.0f} GB; lower --redundant or add GPUs"
        )


def redundancy_options(experts: int, gpus: int, limit: int = 4) -> list[int]:
    """Redundant-slot counts that fill every GPU equally: ``r0 + i G`` with ``r0 = -E mod G``."""
    r0 = (-experts) % gpus
    return [r0 + i * gpus for i in range(limit) if (experts + r0 + i * gpus) // gpus <= experts]


def _mean_or_none(xs: list[float | None]) -> float | None:
    """The mean, or None when any layer's value was not computed within the time limit."""
    return None if any(x is None for x in xs) else float(np.mean(xs))


@dataclass
class LayeredPlacement:
    """One placement per MoE layer (or one shared by all), with what it costs and buys."""

    layers: list[int]
    results: list[PlacementResult]
    shared: bool
    """True when one placement serves every layer (the loads were one layer, or merged)."""

    @property
    def imbalance(self) -> float:
        """Mean over layers: the factor on the expert part of a step (layers run one after another)."""
        return float(np.mean([r.imbalance for r in self.results]))

    @property
    def greedy_imbalance(self) -> float:
        return float(np.mean([r.greedy_imbalance for r in self.results]))

    def to_json(self) -> dict:
        first = self.results[0]
        out = {
            "imbalance": self.imbalance,
            "greedy_imbalance": self.greedy_imbalance,
            "imbalance_balanced": _mean_or_none([r.imbalance_balanced for r in self.results]),
            "greedy_imbalance_balanced": _mean_or_none([r.greedy_imbalance_balanced for r in self.results]),
            "experts": first.experts,
            "gpus": first.gpus,
            "redundant_experts": first.redundant,
            "slots_per_gpu": first.slots_per_gpu,
            "routing": ROUTING,
            "layers_placed": "one placement for every layer" if self.shared else "one placement per layer",
        }
        if len(self.results) == 1:
            one = first.to_json()
            out.update({k: one[k] for k in ("placement", "replicas", "greedy_placement", "node_spread",
                                             "greedy_node_spread", "solver")})
        else:
            out["imbalance_aggregate"] = "mean over layers"
            out["solver"] = {
                "status": "optimal" if all(r.solver["status"] == "optimal" for r in self.results) else "feasible",
                "mip_gap": max(r.solver["mip_gap"] for r in self.results),
                "wall_s": sum(r.solver["wall_s"] for r in self.results),
            }
            out["layers"] = [{"layer": layer, **r.to_json()} for layer, r in zip(self.layers, self.results, strict=True)]
            out["placement"] = {str(layer): r.placement for layer, r in zip(self.layers, self.results, strict=True)}
            out["replicas"] = {str(layer): r.to_json()["replicas"] for layer, r in zip(self.layers, self.results, strict=True)}
        return out


def place_layers(loads: dict[int, np.ndarray], gpus: int, redundant: int, *, gpus_per_node: int = 8,
                 time_limit_s: float = 10.0, mip_gap: float = 1e-4, seed: int = 0,
                 merge: bool = False) -> LayeredPlacement:
    """Place every layer of ``loads`` (the time limit is shared among layers), or with ``merge`` one
    placement for all layers from their summed shares."""
    if merge and len(loads) > 1:
        total = sum(v / v.sum() for v in loads.values())
        loads = {min(loads): total}
        shared = True
    else:
        shared = len(loads) == 1
    deadline = time.perf_counter() + time_limit_s
    results = []
    for i, v in enumerate(loads.values()):
        # each layer gets an equal share of what is left (the greedy baseline is always computed)
        per = max((deadline - time.perf_counter()) / (len(loads) - i), 0.05)
        results.append(place_experts(v, gpus, redundant, gpus_per_node=gpus_per_node, time_limit_s=per,
                                     mip_gap=mip_gap, seed=seed))
    return LayeredPlacement(list(loads), results, shared)


@dataclass
class RedundancyChoice:
    chosen: LayeredPlacement
    curve: list[dict]
    rule: str


def choose_redundant(loads: dict[int, np.ndarray], gpus: int, *, model=None, hw=None, weights: str | None = None,
                     gpus_per_node: int = 8, time_limit_s: float = 10.0, mip_gap: float = 1e-4, seed: int = 0,
                     merge: bool = False, tolerance: float = 0.01, max_memory_fraction: float = 0.10) -> RedundancyChoice:
    """``--redundant auto``: place at each redundancy that fills the GPUs equally (``r0 + i G``), as
    far as memory allows, and take the smallest whose imbalance is within ``tolerance`` of the best.

    Memory: extra copies may take at most ``max_memory_fraction`` of the GPU's HBM (the rest stays
    for KV cache); without a hardware entry only the slot count limits R.
    """
    experts = len(next(iter(loads.values())))
    options = redundancy_options(experts, gpus)
    per_copy = expert_copy_bytes(model, weights) if model is not None else None
    curve, runs = [], []
    allowed = []
    for r in options:
        extra = None if per_copy is None else (experts + r) / gpus * per_copy - experts / gpus * per_copy
        if hw is not None and extra is not None and extra > max_memory_fraction * hw.hbm_bytes and r != options[0]:
            continue
        allowed.append((r, extra))
    if not allowed:
        raise InputError(f"--gpus {gpus}: no redundancy fills every GPU equally; pick --gpus dividing {experts} + R")
    deadline = time.perf_counter() + time_limit_s
    for i, (r, extra) in enumerate(allowed):
        share = max((deadline - time.perf_counter()) / (len(allowed) - i), 0.05)
        lp = place_layers(loads, gpus, r, gpus_per_node=gpus_per_node, time_limit_s=share,
                          mip_gap=mip_gap, seed=seed, merge=merge)
        runs.append(lp)
        curve.append({"redundant_experts": r, "slots_per_gpu": (experts + r) // gpus, "imbalance": lp.imbalance,
                      "greedy_imbalance": lp.greedy_imbalance,
                      "extra_bytes_per_gpu": extra})
    best = min(c["imbalance"] for c in curve)
    pick = next(i for i, c in enumerate(curve) if c["imbalance"] <= best * (1.0 + tolerance))
    rule = (f"smallest R whose imbalance is within {tolerance:.0%} of the best over R in "
            f"{[c['redundant_experts'] for c in curve]}"
            + (f" (extra copies <= {max_memory_fraction:.0%} of HBM)" if hw is not None else ""))
    return RedundancyChoice(runs[pick], curve, rule)


MAP_FORMAT = "planner-expert-placement/1"


def placement_map(lp: LayeredPlacement, *, model_id: str, moe_layers: int) -> dict:
    """The placement as the tensors serving engines use: physical slot ``p = gpu x S + j`` holds
    logical expert ``physical_to_logical_map[layer][p]`` (SGLang's ``--init-expert-location`` file
    layout; vLLM's EPLB state uses the same three maps). A shared placement fills every MoE layer."""
    first = lp.results[0]
    per_layer = [r.placement for r in lp.results]
    layer_ids = lp.layers
    if lp.shared:
        per_layer = per_layer * moe_layers
        layer_ids = list(range(moe_layers))
    p2l, l2p, counts = [], [], []
    done: dict[int, tuple] = {}  # a shared placement repeats one object per layer: its maps are made once
    for placement in per_layer:
        if id(placement) not in done:
            flat = [e for hold in placement for e in hold]
            inv: list[list[int]] = [[] for _ in range(first.experts)]
            for p, e in enumerate(flat):
                inv[e].append(p)
            done[id(placement)] = (flat, inv, [len(x) for x in inv])
        flat, inv, count = done[id(placement)]
        p2l.append(flat)
        l2p.append(inv)
        counts.append(count)
    return {
        "format": MAP_FORMAT,
        "model": model_id,
        "ep_size": first.gpus,
        "num_logical_experts": first.experts,
        "num_redundant_experts": first.redundant,
        "num_physical_experts": first.experts + first.redundant,
        "slots_per_gpu": first.slots_per_gpu,
        "layers": layer_ids,
        "imbalance": lp.imbalance,
        "physical_to_logical_map": p2l,
        "logical_to_physical_map": l2p,
        "logical_replica_count": counts,
    }
