"""Measured kernel rows as the curve fits read them (:mod:`planner.calib.kernels`): one curve's shape columns and
measured seconds, and the checks every reader applies to its file (a missing column or a non-positive size is a
one-line error naming the file and the column)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from planner.errors import InputError

SYSTEM_GPUS_PER_NODE = {"gb200": 4, "gb300": 4}
"""GPUs of one node tray in the kernel data (DeepEP's ``node_num``); 8 elsewhere."""


@dataclass
class Rows:
    """One curve's rows: the shape columns the family's predictor reads, measured seconds, a held-out mask."""

    x: dict[str, np.ndarray]
    y: np.ndarray
    hold: np.ndarray
    holdout: str
    engine_version: str
    kernel: str = ""
    """The engine's kernel path where it runs more than one for the family's shapes (``-mmha``: TensorRT-LLM's
    generic decode attention; ``-triton`` and the like: a fused-MoE kernel other than the engine's main one for the
    format), appended to the engine in the curve's key; the reader's key is the format plus it."""
    group: np.ndarray | None = None
    """Per row, the routing it was measured under where a family has more than one (fused MoE: ``balanced`` or
    ``skewed``), for the report's breakdown."""



def _need(df: pd.DataFrame, path: Path, cols: tuple[str, ...]) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise InputError(f"{path}: column {missing[0]} is missing (the family is skipped for this system)")


def _need_sizes(df: pd.DataFrame, path: Path, cols: tuple[str, ...]) -> None:
    """Shape columns must be finite and positive: one that is not names the file, the column and a bad value."""
    for c in cols:
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(float)
        bad = ~(np.isfinite(v) & (v > 0))
        if bad.any():
            raise InputError(f"{path}: column {c} holds {df[c].astype(str).iloc[int(np.argmax(bad))]}, not a positive size "
                             "(the family is skipped for this system)")


def _fastest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The fastest kernel per shape (what an engine's autotuner runs); positive finite latencies only."""
    df = df[np.isfinite(df["latency"]) & (df["latency"] > 0)]
    return df.groupby(keys, as_index=False)["latency"].min()


def _version(df: pd.DataFrame) -> str:
    return str(df["version"].iloc[0]) if "version" in df.columns and len(df) else ""
