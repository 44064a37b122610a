"""planner: optimisation-based deployment planner for large language model serving."""

from __future__ import annotations

__version__ = "0.1.0"
