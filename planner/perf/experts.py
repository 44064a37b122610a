"""Expert loads and the greedy placement baseline (pure NumPy).

A Mixture-of-Experts layer runs as slowly as its busiest GPU. ``load[e]`` is the share of routed
tokens expert ``e`` receives; a placement puts ``E + R`` expert copies on ``G`` GPUs, ``(E + R) / G``
slots each. Two routing assumptions turn a placement into GPU loads:

- ``even``: each expert's tokens split evenly among its copies (what DeepSeek's EPLB assumes);
- ``balanced``: a router that splits each expert's tokens among its copies to even out GPU loads
  (the best any dispatcher can do for a placement; computed by an LP in ``planner.model.experts``).

Imbalance is max / mean GPU load; it multiplies the expert part of a decode step.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from planner.catalog.expert_loads import parse_skew, zipf_loads  # noqa: F401  (loads as the scenario gives them)


def greedy_replicas(load: np.ndarray, redundant: int) -> np.ndarray:
    """EPLB replication: give each redundant slot to the expert with the largest load per copy."""
    n = np.ones(len(load), dtype=int)
    for _ in range(redundant):
        n[int(np.argmax(load / n))] += 1
    return n


def greedy_pack(load: np.ndarray, replicas: np.ndarray, gpus: int) -> list[list[int]]:
    """EPLB packing: copies (load / copies each) heaviest first onto the least-loaded GPU that has a
    free slot and does not hold that expert yet (any GPU with a free slot if none). Ties go to the
    lowest GPU index. A heap of (load, GPU) keeps it ``O(copies log G)`` (4,096 GPUs in well under a second)."""
    slots = int(replicas.sum()) // gpus
    items = sorted(((load[e] / replicas[e], e) for e in range(len(load)) for _ in range(replicas[e])), key=lambda t: (-t[0], t[1]))
    heap = [(0.0, g) for g in range(gpus)] if slots > 0 else []
    held: list[list[int]] = [[] for _ in range(gpus)]
    holds: list[set[int]] = [set() for _ in range(gpus)]
    for w, e in items:
        popped = []
        while heap and e in holds[heap[0][1]]:
            popped.append(heapq.heappop(heap))
        # a GPU without this expert when there is one, else the least-loaded GPU with a free slot
        top = heapq.heappop(heap) if heap else popped.pop(0)
        for item in popped:
            heapq.heappush(heap, item)
        gl, g = top
        held[g].append(e)
        holds[g].add(e)
        if len(held[g]) < slots:
            heapq.heappush(heap, (gl + w, g))
    return held


def replicas_of(placement: list[list[int]], experts: int) -> np.ndarray:
    n = np.zeros(experts, dtype=int)
    for hold in placement:
        for e in hold:
            n[e] += 1
    return n


def even_split_loads(load: np.ndarray, placement: list[list[int]]) -> np.ndarray:
    """GPU loads when every expert's tokens split evenly among its copies."""
    n = replicas_of(placement, len(load))
    return np.array([sum(load[e] / n[e] for e in hold) for hold in placement])


def imbalance(gpu_loads: np.ndarray) -> float:
    gpu_loads = np.asarray(gpu_loads, dtype=float)
    return float(gpu_loads.max() / gpu_loads.mean())


def node_spread(placement: list[list[int]], gpus_per_node: int, experts: int) -> float:
    """Mean number of nodes an expert's copies span (1 = every expert stays inside one node)."""
    nodes: list[set[int]] = [set() for _ in range(experts)]
    for g, hold in enumerate(placement):
        for e in hold:
            nodes[e].add(g // gpus_per_node)
    return float(np.mean([len(s) for s in nodes]))


def expert_copy_bytes(model, weights: str | None = None) -> float:
    """Bytes of one routed expert's weights across all MoE layers (one redundant slot per GPU costs
    this much HBM on that GPU), at the model's expert format or ``weights``."""
    from planner.perf.params import model_stats, resolve_dtypes
    from planner.units import dtype_bytes

    s = model_stats(model)
    _, expert_dtype = resolve_dtypes(model, weights)
    return s.expert_params * s.moe_layers * dtype_bytes(expert_dtype)


def swap_descent(weights: np.ndarray, placement: list[list[int]], max_steps: int = 10_000,
                 deadline: float | None = None) -> list[list[int]]:
    """Local search under even split: swap one copy on the busiest GPU with one copy elsewhere
    whenever that lowers the larger of the two GPUs' loads below the busiest load; stop at a local
    optimum, or at ``deadline`` (a ``time.perf_counter()`` value; every step keeps the placement valid).
    ``weights[e]`` is the load of one copy of expert ``e`` (its load / copies)."""
    P = np.array(placement, dtype=int)  # G x S
    G, S = P.shape
    q = np.asarray(weights, dtype=float)
    L = q[P].sum(axis=1)
    for _ in range(max_steps):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        g = int(np.argmax(L))
        a = q[P[g]]  # S
        b = q[P]  # G x S
        delta = b[None, :, :] - a[:, None, None]  # (S, G, S): new_g = L[g] + delta; new_h = L[h] - delta
        new_g = L[g] + delta
        new_h = L[None, :, None] - delta
        cost = np.maximum(new_g, new_h)
        cost[:, g, :] = np.inf
        # a copy may not land on a GPU that already holds its expert
        on_g = np.isin(P, P[g])  # G x S: expert of (h, j) already on g
        cost[:, on_g] = np.inf
        holds = (P[:, :, None] == P[g][None, None, :]).any(axis=1)  # G x S(g items): h holds expert of g's item i
        cost = np.where(holds.T[:, :, None], np.inf, cost)
        i, h, j = np.unravel_index(int(np.argmin(cost)), cost.shape)
        if not cost[i, h, j] < L[g] - 1e-12:
            break
        P[g, i], P[h, j] = P[h, j], P[g, i]
        L[g] = q[P[g]].sum()
        L[h] = q[P[h]].sum()
    return [sorted(int(e) for e in row) for row in P]


_HEURISTIC: dict[tuple, tuple[list[list[int]], float]] = {}


def heuristic_placement(load: np.ndarray, gpus: int, redundant: int) -> tuple[list[list[int]], float]:
    """EPLB greedy improved by :func:`swap_descent`: a placement and its even-split imbalance, fast
    enough to price every expert-parallel layout of a candidate table (memoised). The placement MILP
    (``planner.experts``) starts from this and never does worse."""
    load = np.asarray(load, dtype=float)
    key = (load.tobytes(), int(gpus), int(redundant))
    if key not in _HEURISTIC:
        n = greedy_replicas(load, redundant)
        placement = swap_descent(load / load.sum() * gpus / n, greedy_pack(load, n, gpus))
        _HEURISTIC[key] = (placement, imbalance(even_split_loads(load, placement)))
    return _HEURISTIC[key]
