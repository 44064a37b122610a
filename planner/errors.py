"""Error types that the CLI maps to exit codes (design.md section 5)."""

from __future__ import annotations


class PlannerError(Exception):
    """Base class of errors a user can fix; the CLI prints the message on one line."""

    exit_code = 1


class InputError(PlannerError):
    """Bad input: a malformed catalog or scenario, an unknown id, an invalid layout (exit 1)."""

    exit_code = 1


class InfeasibleError(PlannerError):
    """The request cannot be met; the message carries the computed diagnosis (exit 2)."""

    exit_code = 2


class SolverLimitError(PlannerError):
    """The solver stopped at its time or node limit before finding any plan (exit 3)."""

    exit_code = 3


class PlanCheckError(PlannerError):
    """The chosen plan failed its re-check by the performance model alone (exit 1): no plan is written."""

    exit_code = 1
