"""Options of one planning run (time limits, gap, analysis, processes), shared by the pipeline, the analysis,
sweeps and the CLI."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_MIP_GAP = 1e-4


@dataclass
class PlanOptions:
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    mip_gap: float = DEFAULT_MIP_GAP
    engine: str | None = None
    analysis: bool = True
    """Price the binding constraints and find the runner-up (extra solves)."""
    lp_path: str | None = None
    """Also write the MILP in LP format here (readable names), before solving."""
    expert_time_limit_s: float = 3.0
    """Time limit of each expert-placement MILP (MoE pools with expert parallelism)."""
    solver_threads: int | None = None
    """HiGHS threads per solve (None: HiGHS's default; sweeps on a Dask cluster use one per worker)."""
    expert_mip_gap: float = 1e-3
    """Relative gap on the imbalance at which expert placement stops: 0.1% of the expert part of a step,
    far below the performance model's own error (the search otherwise spends its whole budget for nothing)."""
    prefix_shares: dict[str, tuple[float, float]] | None = None
    """Per workload, the range of prefix working set per request/s (bytes per req/s) the plan's models may be
    given, which candidate pruning must answer for (None: the scenario's own, widened for the analysis; a
    sweep that varies demand or working sets sets the range of its points)."""
    jobs: int | None = None
    """Processes that re-solve the analysis's questions (1: this one; None: one per core up to
    :data:`MAX_ANALYSIS_JOBS`, where the plan's own solve took at least :data:`PARALLEL_MIN_SOLVE_S`, so that
    a plan of a few seconds pays no process start-up). Workers started ahead (:func:`prestart_workers`) also
    evaluate part of the candidates."""
