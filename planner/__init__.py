"""planner: optimisation-based deployment planner for large language model serving.

The public API (what the ``planner`` command itself calls)::

    import planner

    rs = planner.load_scenario("catalogs/scenarios/llama-70b-chat.yaml")
    plan = planner.plan(rs)                       # a Plan: the schema of plan.json
    plan.pools_frame()                            # pools, units, workloads, periods as DataFrames
    full = planner.make_plan(rs, planner.PlanOptions(analysis=False))   # plan, candidate table, model data, timings
    df = planner.run_sweep("catalogs/scenarios/llama-70b-chat.yaml", ["workloads.chat.requests_per_s=25,50,100"])

Names are imported on first use, so ``import planner`` stays light (the command line starts fast).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from planner.version import __version__

if TYPE_CHECKING:
    import pandas as pd

    from planner.catalog.loader import Catalog
    from planner.catalog.scenario import ResolvedScenario
    from planner.options import PlanOptions
    from planner.results import Plan

__all__ = ["Plan", "PlanOptions", "Planned", "__version__", "load_catalog", "load_scenario", "make_plan", "plan",
           "run_sweep"]

_LAZY = {
    "Plan": ("planner.results", "Plan"),
    "PlanOptions": ("planner.options", "PlanOptions"),
    "Planned": ("planner.pipeline.plan", "Planned"),
    "make_plan": ("planner.pipeline.plan", "make_plan"),
    "load_catalog": ("planner.catalog.loader", "load_catalog"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


def load_scenario(path: str | Path, catalog: Catalog | None = None, *, engine: str | None = None,
                  existing: str | Path | None = None) -> ResolvedScenario:
    """Read a scenario YAML and bind it to ``catalog`` (the bundled one by default); ``engine`` runs every pool
    on that engine; ``existing`` (a plan folder) re-plans from that plan's fleet with the scenario's change costs
    (``planner plan --from``). Bad input raises :class:`planner.errors.InputError` naming the file and field."""
    from planner.catalog.loader import load_catalog
    from planner.catalog.scenario import load_scenario as read_scenario
    from planner.catalog.scenario import resolve_scenario, with_engine

    sc = read_scenario(path)
    if existing is not None:
        from planner.catalog.fleet import ExistingFleet

        sc = sc.model_copy(update={"existing": ExistingFleet(plan=str(Path(existing).resolve()))})
    rs = resolve_scenario(sc, catalog if catalog is not None else load_catalog(), path)
    return with_engine(rs, engine) if engine is not None else rs


def plan(scenario: ResolvedScenario | str | Path, options: PlanOptions | None = None, *,
         catalog: Catalog | None = None, progress=None) -> Plan:
    """The cheapest plan that meets ``scenario`` (a path or a :func:`load_scenario` result), re-checked by the
    performance model alone. Raises :class:`planner.errors.InfeasibleError` with a diagnosis where none exists."""
    from planner.pipeline.plan import make_plan

    rs = load_scenario(scenario, catalog) if isinstance(scenario, (str, Path)) else scenario
    return make_plan(rs, options, progress=progress).plan


def run_sweep(scenario: str | Path, vary: list[str], *, catalog: Catalog | None = None, jobs: int = 1,
              options: PlanOptions | None = None) -> pd.DataFrame:
    """Re-solve ``scenario`` over the Cartesian product of ``vary`` specs (``path=v1,v2`` or ``path=lo:hi:lin:n``,
    as ``planner sweep --vary``): one row per point (inputs, status, costs, each workload's choice)."""
    from planner.catalog.loader import load_catalog, read_yaml
    from planner.sweep import parse_vary
    from planner.sweep import run_sweep as sweep_points

    path = Path(scenario)
    base = read_yaml(path)
    cat = catalog if catalog is not None else load_catalog()
    return sweep_points(base, path, [parse_vary(v) for v in vary], cat, jobs=jobs, opts=options)
