"""The planning pipeline: a scenario in, a re-checked plan out (:func:`~planner.pipeline.plan.make_plan`), with the
day over a traffic profile (:mod:`~planner.pipeline.periods`), expert placement (:mod:`~planner.pipeline.experts`)
and a diagnosis where there is no plan (:mod:`~planner.pipeline.diagnose`)."""

from planner.options import PlanOptions
from planner.pipeline.plan import Planned, input_hash, make_plan

__all__ = ["PlanOptions", "Planned", "input_hash", "make_plan"]
