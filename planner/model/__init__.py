"""The Pyomo MILP: prepared data in (:mod:`planner.model.data`), a model out (:mod:`planner.model.build`).

Never reads files and never evaluates physics: every coefficient comes from the candidate table.
"""

from planner.model.build import build_model
from planner.model.data import HardwareData, PlanData, WorkloadData, prepare

__all__ = ["HardwareData", "PlanData", "WorkloadData", "build_model", "prepare"]
