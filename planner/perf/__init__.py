"""Performance model: pure functions of catalog entries (no Pyomo, no file I/O).

``params``: parameter and KV-cache bytes. ``layout``: parallel layouts and bytes per chip.
``roofline``: decode step and prefill times. ``serving``: TTFT/TPOT of aggregated and
disaggregated deployments with queueing, tokens/s and cost.
"""

from __future__ import annotations
