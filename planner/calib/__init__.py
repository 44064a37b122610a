"""Calibration and validation against measured serving data (reads CSV files; uses perf/ only)."""

from __future__ import annotations
