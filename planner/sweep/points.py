"""A sweep's points: ``--vary`` specs parsed, the Cartesian product generated lazily in the order that shares
work (candidate pools, then models), and the keys that group points sharing a pool or a model.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from planner.catalog.loader import Catalog, format_validation_error
from planner.catalog.scenario import ResolvedScenario, Scenario, resolve_scenario
from planner.errors import InputError
from planner.model.families import FAMILIES
from planner.perf.candidates import prefix_shares

MUTABLE = ("requests_per_s", "working_set_gb", "prices", "max_units", "power_kw", "budget_usd_per_hour")


@dataclass(frozen=True)
class Vary:
    path: str
    values: tuple[float, ...]


MAX_POINTS_PER_VARY = 1_000_000
"""Values one ``--vary`` range may generate (the product of all of them is capped by ``--max-points``)."""


def parse_values(text: str, flag: str = "--vary") -> tuple[float, ...]:
    """``100,200,400`` or ``lo:hi:log:n`` / ``lo:hi:lin:n``."""
    text = text.strip()
    parts = text.split(":")
    try:
        if len(parts) == 4:
            lo, hi, kind, n = float(parts[0]), float(parts[1]), parts[2].strip().lower(), int(parts[3])
            if n < 1:
                raise ValueError
            if n > MAX_POINTS_PER_VARY:
                raise InputError(f"{flag}: {n:,} values in one range; at most {MAX_POINTS_PER_VARY:,}")
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise InputError(f"{flag}: range ends must be finite numbers, got '{text}'")
            if kind == "log":
                if lo <= 0 or hi <= 0:
                    raise InputError(f"{flag}: a log range needs positive ends, got '{text}'")
                vals = np.geomspace(lo, hi, n)
            elif kind == "lin":
                vals = np.linspace(lo, hi, n)
            else:
                raise ValueError
        elif len(parts) == 1:
            vals = np.array([float(v) for v in text.split(",") if v.strip()])
            if vals.size == 0:
                raise ValueError
            if not np.isfinite(vals).all():
                raise InputError(f"{flag}: values must be finite numbers, got '{text}'")
        else:
            raise ValueError
    except ValueError:
        raise InputError(
            f"{flag}: values must be a list (100,200,400) or a range lo:hi:log:n or lo:hi:lin:n, got '{text}'"
        ) from None
    return tuple(float(v) for v in vals)


def parse_vary(spec: str) -> Vary:
    path, eq, vals = spec.partition("=")
    if not eq or not path.strip():
        raise InputError(f"--vary: expected PATH=VALUES (e.g. workloads.chat.requests_per_s=100,200), got '{spec}'")
    return Vary(path.strip(), parse_values(vals, f"--vary {path.strip()}"))


def set_path(doc: dict, path: str, value) -> None:
    """Set a dotted ``path`` in a scenario mapping; list items (workloads) are addressed by name."""
    keys = path.split(".")
    node = doc
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            match = [x for x in node if isinstance(x, dict) and x.get("name") == k]
            if not match:
                names = ", ".join(str(x.get("name")) for x in node if isinstance(x, dict))
                raise InputError(f"--vary {path}: no item named '{k}' (have: {names})")
            if last:
                raise InputError(f"--vary {path}: points at a whole item; name a field inside it")
            node = match[0]
            continue
        if not isinstance(node, dict):
            raise InputError(f"--vary {path}: '{'.'.join(keys[:i])}' is a value, not a group of fields")
        if last:
            node[k] = value
        else:
            if node.get(k) is None:
                node[k] = {}
            node = node[k]


def _typed(value: float):
    return int(value) if float(value).is_integer() else value


MAX_POINTS = 10_000
"""Points a sweep runs unless ``--max-points`` raises the cap (each point is a MILP solve)."""


def count_points(varies: list[Vary]) -> int:
    return math.prod(len(v.values) for v in varies)


def apply_values(base: dict, pairs) -> tuple[dict, dict]:
    doc = copy.deepcopy(base)
    inputs = {}
    for v, val in pairs:
        set_path(doc, v.path, _typed(val))
        inputs[v.path] = val
    return inputs, doc


def _level(base: dict, v: Vary) -> int:
    """How much of the work a vary invalidates: 0 the evaluated candidates, 1 the Pyomo model (SLOs),
    2 only mutable parameters (demand, prices, limits)."""
    if len(v.values) < 2:
        return 2
    keys = [keys_of(apply_values(base, [(v, x)])[1]) for x in v.values[:2]]
    return 0 if keys[0][0] != keys[1][0] else 1 if keys[0][1] != keys[1][1] else 2


def iter_points(base: dict, varies: list[Vary]) -> Iterator[tuple[int, dict, dict]]:
    """``(index, inputs, scenario mapping)`` for every point of the Cartesian product, generated one at a
    time (never all at once). ``index`` is the point's position in the product taken in ``varies`` order
    (the last vary fastest); points come out with the inputs that change the evaluated candidates outermost
    and mutable parameters innermost, so consecutive points share their candidate pool and model."""
    order = sorted(range(len(varies)), key=lambda k: _level(base, varies[k]))
    strides = [math.prod(len(v.values) for v in varies[k + 1:]) for k in range(len(varies))]
    for combo in itertools.product(*(range(len(varies[k].values)) for k in order)):
        idx = sum(strides[k] * c for k, c in zip(order, combo, strict=True))
        picks = sorted(zip(order, combo, strict=True))
        inputs, doc = apply_values(base, [(varies[k], varies[k].values[c]) for k, c in picks])
        yield idx, inputs, doc


def point_scenarios(base: dict, varies: list[Vary]) -> list[tuple[dict, dict]]:
    """``(inputs, scenario mapping)`` for every point, in product order (small sweeps and tests)."""
    pts = sorted(iter_points(base, varies), key=lambda t: t[0])
    return [(inputs, doc) for _, inputs, doc in pts]


def sweep_shares(base: dict, varies: list[Vary]) -> dict[str, tuple[float, float]] | None:
    """The range of prefix working set per request/s each workload takes over the sweep's points, for the
    candidate pruning of models whose demand and working sets the points change in place (a model built for
    one point serves them all); ``None`` where no vary moves a workload's demand or prefix cache (each
    point's own range is the scenario's). The share falls with demand and grows with the working set, so only
    each vary's smallest and largest value are combined (at most 2^k scenarios for k such varies, not the
    sweep's product; every combination where the schema refuses an extreme one). A combination the schema
    refuses is left to its point's own error."""
    rel = [v for v in varies if v.path.split(".")[0] == "workloads"
           and (v.path.endswith(".requests_per_s") or ".prefix_cache" in v.path)]
    if not rel:
        return None
    out, complete = _share_range(base, rel, itertools.product(*({min(v.values), max(v.values)} for v in rel)))
    if not complete:  # an extreme the schema refuses: every combination, as the points themselves
        out, _ = _share_range(base, rel, itertools.product(*(v.values for v in rel)))
    return out or None


def _share_range(base: dict, rel: list[Vary], combos) -> tuple[dict[str, tuple[float, float]], bool]:
    """:func:`sweep_shares` over ``combos``, and whether the schema accepted every one of them."""
    out: dict[str, tuple[float, float]] = {}
    complete = True
    for combo in combos:
        try:
            sc = Scenario.model_validate(apply_values(base, list(zip(rel, combo, strict=True)))[1])
        except (ValidationError, InputError):
            complete = False
            continue
        for w, (lo, hi) in prefix_shares(sc.workloads).items():
            a, b = out.get(w, (lo, hi))
            out[w] = (min(a, lo), max(b, hi))
    return out, complete


def validate_point(doc: dict, catalog: Catalog, path: Path, inputs: dict) -> ResolvedScenario:
    where = ", ".join(f"{k}={_typed(v)}" for k, v in inputs.items())
    try:
        sc = Scenario.model_validate(doc)
    except ValidationError as err:
        raise InputError(format_validation_error(Path(f"{path} with {where}"), err)) from None
    return resolve_scenario(sc, catalog, path)


def _blank(doc: dict, slos: bool) -> dict:
    """The scenario with mutable inputs replaced by what the structure depends on (whether they are
    set, and whether a working set is zero); with ``slos`` the SLOs blanked too, except the TPOT target and its
    quantile: the candidates get a row at the largest batch that meets it (``planner.perf.refine``), so points
    with another TPOT evaluate their own pool, as a plan of that point does."""
    d = copy.deepcopy(doc)
    for w in d.get("workloads", []):
        w.pop("requests_per_s", None)
        pc = w.get("prefix_cache") or {}
        if "working_set_gb" in pc:
            pc["working_set_gb"] = bool(pc["working_set_gb"])
        if slos:
            slo = w.pop("slo", None) or {}
            w["slo"] = {k: v for k, v in slo.items() if k in ("tpot_ms", "quantile", "tpot_quantile")}
    d["prices"] = sorted((d.get("prices") or {}).keys())
    lim = d.get("limits") or {}
    for f in FAMILIES:  # the limits a re-solve varies in place (mutable parameters): only whether they are set counts
        if f.sweepable and f.path and f.path.startswith("limits."):
            k = f.path.split(".")[1]
            lim[k] = sorted((lim.get(k) or {}).keys()) if isinstance(lim.get(k), dict) else lim.get(k) is not None
    d["limits"] = lim
    return d


def keys_of(doc: dict) -> tuple[str, str]:
    """(pool key, model key): points sharing a pool key share candidate evaluation; sharing a model
    key they share the Pyomo model too."""
    return (json.dumps(_blank(doc, True), sort_keys=True, default=str),
            json.dumps(_blank(doc, False), sort_keys=True, default=str))

