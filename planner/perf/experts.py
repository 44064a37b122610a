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

import numpy as np


def zipf_loads(experts: int, s: float, seed: int) -> np.ndarray:
    """Seeded power-law loads: expert ranks ``1..E`` get weight ``rank^-s``, ranks shuffled, normalised to sum 1."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, experts + 1, dtype=float) ** (-float(s))
    # Multiplicative noise so that seeds differ beyond a permutation.
    w = w * rng.lognormal(0.0, 0.25, experts)
    rng.shuffle(w)
    return w / w.sum()


def greedy_replicas(load: np.ndarray, redundant: int) -> np.ndarray:
    """EPLB replication: give each redundant slot to the expert with the largest load per copy."""
    n = np.ones(len(load), dtype=int)
    for _ in range(redundant):
        n[int(np.argmax(load / n))] += 1
    return n


def greedy_pack(load: np.ndarray, replicas: np.ndarray, gpus: int) -> list[list[int]]:
    """EPLB packing: copies (load / copies each) heaviest first onto the least-loaded GPU that has a
    free slot and does not hold that expert yet (any GPU with a free slot if none)."""
    slots = int(replicas.sum()) // gpus
    items = sorted(((load[e] / replicas[e], e) for e in range(len(load)) for _ in range(replicas[e])), key=lambda t: (-t[0], t[1]))
    gl = np.zeros(gpus)
    held: list[list[int]] = [[] for _ in range(gpus)]
    for w, e in items:
        free = [g for g in range(gpus) if len(held[g]) < slots]
        fresh = [g for g in free if e not in held[g]] or free
        g = min(fresh, key=lambda k: (gl[k], k))
        held[g].append(e)
        gl[g] += w
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


def expert_bytes(model) -> float:
    """Bytes of one routed expert's weights in one MoE layer (gate/up/down) at the model's expert dtype."""
    from planner.units import DTYPE_BYTES

    arch = model.architecture
    mats = 3 if arch.ffn_gated else 2
    dt = model.expert_weights_dtype or model.weights_dtype
    return mats * arch.hidden_size * arch.moe.expert_intermediate * DTYPE_BYTES[dt]
