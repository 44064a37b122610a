"""Read measured expert loads (CSV) for ``planner experts``.

Two shapes: ``expert,load`` (one MoE layer) or ``layer,expert,load`` (several). ``load`` is any
non-negative count or share (tokens routed to the expert); experts absent from a layer get 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.errors import InputError


def read_expert_loads(path: Path, experts: int) -> dict[int, np.ndarray]:
    """Layer -> load vector of length ``experts`` (layer 0 for the one-layer shape)."""
    from planner.catalog.inputs import read_csv

    path = Path(path)
    df = read_csv(path, dtype=str, skipinitialspace=True)
    cols = [c.strip().lower() for c in df.columns]
    df.columns = cols
    if set(cols) not in ({"expert", "load"}, {"layer", "expert", "load"}):
        raise InputError(f"{path}: expected columns expert,load or layer,expert,load, found {','.join(cols)}")
    if df.empty:
        raise InputError(f"{path}: no rows")
    if "layer" not in df:
        df["layer"] = "0"
    out: dict[int, np.ndarray] = {}
    seen: set[tuple[int, int]] = set()
    for i, row in enumerate(df.itertuples(index=False), start=2):
        where = f"{path} line {i}"
        try:
            layer, expert = int(str(row.layer)), int(str(row.expert))
        except ValueError:
            raise InputError(f"{where}: layer and expert must be whole numbers, got '{row.layer}', '{row.expert}'") from None
        try:
            load = float(str(row.load))
        except ValueError:
            raise InputError(f"{where}: load '{row.load}' is not a number") from None
        if not np.isfinite(load) or load < 0:
            raise InputError(f"{where}: load {row.load} must be a finite number >= 0")
        if not 0 <= expert < experts:
            raise InputError(f"{where}: expert {expert} does not exist; the model has experts 0..{experts - 1}")
        if layer < 0:
            raise InputError(f"{where}: layer {layer} must be >= 0")
        if (layer, expert) in seen:
            raise InputError(f"{where}: expert {expert} of layer {layer} appears twice")
        seen.add((layer, expert))
        out.setdefault(layer, np.zeros(experts))[expert] = load
    for layer, v in out.items():
        if v.sum() <= 0:
            raise InputError(f"{path}: layer {layer} has no load at all; give at least one positive load")
    return dict(sorted(out.items()))


def zipf_loads(experts: int, s: float, seed: int) -> np.ndarray:
    """Seeded power-law loads: expert ranks ``1..E`` get weight ``rank^-s``, ranks shuffled, normalised to sum 1."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, experts + 1, dtype=float) ** (-float(s))
    # Multiplicative noise so that seeds differ beyond a permutation.
    w = w * rng.lognormal(0.0, 0.25, experts)
    rng.shuffle(w)
    return w / w.sum()


def parse_skew(text: str) -> float:
    """``zipf:S`` -> S (``S >= 0``; 0 is uniform)."""
    kind, _, val = text.partition(":")
    try:
        s = float(val)
    except ValueError:
        s = -1.0
    if kind.strip().lower() != "zipf" or not (0.0 <= s <= 5.0):
        raise ValueError(f"--skew: expected zipf:S with 0 <= S <= 5 (e.g. zipf:1.0), got '{text}'")
    return s
