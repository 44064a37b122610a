"""Results: the plan's schema (:mod:`~planner.results.schema`), the plan read from a solved model
(:mod:`~planner.results.extract`) and its re-check by the performance model alone (:mod:`~planner.results.recheck`).
"""

from planner.model.build import solution_values
from planner.results.extract import extract, pack, physics_path, role_loads, served_requests, unvalidated
from planner.results.recheck import capacity_after_losing, recheck, unit_losses
from planner.results.schema import (
    REL_TOL,
    SCHEMA_VERSION,
    Binding,
    Check,
    DayCost,
    ExpertPlacementOut,
    GrowthCost,
    LayoutOut,
    MemoryPerChip,
    ModelRef,
    Objective,
    PeriodOut,
    PeriodUnits,
    PlacedGroup,
    Plan,
    Pool,
    Predicted,
    Recheck,
    ResilienceOut,
    RunnerUp,
    SolverInfo,
    UnitGroup,
    UnitPlacement,
    WorkloadOut,
    software_versions,
)

__all__ = [
    "REL_TOL", "SCHEMA_VERSION", "Binding", "Check", "DayCost", "ExpertPlacementOut", "GrowthCost", "LayoutOut", "MemoryPerChip",
    "ModelRef", "Objective", "PeriodOut", "PeriodUnits", "PlacedGroup", "Plan", "Pool", "Predicted", "Recheck",
    "ResilienceOut", "RunnerUp", "SolverInfo", "UnitGroup", "UnitPlacement", "WorkloadOut", "capacity_after_losing",
    "extract", "pack", "physics_path", "recheck", "role_loads", "served_requests", "software_versions",
    "solution_values", "unit_losses", "unvalidated",
]
