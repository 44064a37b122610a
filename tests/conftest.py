from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PLANNER_TEST_SHARED", ROOT.parent / "shared"))
"""The workplace's shared folder; ``PLANNER_TEST_SHARED=/nonexistent`` runs the suite as a user's clone would."""
DATA = ROOT / "tests" / "data"
_CAL = SHARED / "calibration" if (SHARED / "calibration" / "silicon_calibration.csv").is_file() else DATA / "calibration"
CALIB = _CAL / "silicon_calibration.csv"
"""The measured rows: ../shared's whole file where present, else the extract in tests/data (README there)."""
IX = _CAL / "inferencex" / "dsr1_runs.json"
HF_CONFIGS = DATA / "hf-configs"
"""Copies of shared/calibration/hf-configs (tests/data/README.md)."""
REFERENCE = DATA / "reference"


def engine_flags() -> dict:
    """shared/reference/engine-flags.json, from its copy in tests/data (the suite needs no ../shared)."""
    import gzip
    import json

    return json.loads(gzip.decompress((REFERENCE / "engine-flags.json.gz").read_bytes()))


def crd_schema(kind: str) -> dict:
    """``openAPIV3Schema`` of a CRD the export writes (``leaderworkerset``, ``disaggregatedset``, ...)."""
    import gzip
    import json

    return json.loads(gzip.decompress((REFERENCE / "k8s" / f"{kind}.schema.json.gz").read_bytes()))


@pytest.fixture(scope="session")
def catalog():
    from planner.catalog import load_catalog

    return load_catalog(ROOT / "catalogs")


@pytest.fixture(autouse=True)
def _analysis_in_process(monkeypatch):
    """Plans made by the suite answer their analysis in this process unless a test asks for ``jobs``: the default
    (several processes where the plan's solve is slow) would depend on the machine's speed, and tests that patch
    the planner's internals patch this process only. tests/test_analysis_workers.py asks for workers."""
    from planner import planning

    monkeypatch.setattr(planning, "PARALLEL_MIN_SOLVE_S", float("inf"))
    monkeypatch.setattr(planning, "PRESTART_MIN_WORKLOADS", float("inf"))
    monkeypatch.setattr(planning, "CANDIDATE_WORKER_MIN_WORKLOADS", float("inf"))
