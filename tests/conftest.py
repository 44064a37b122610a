from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
CALIB = SHARED / "calibration" / "silicon_calibration.csv"
HF_CONFIGS = SHARED / "calibration" / "hf-configs"


@pytest.fixture(scope="session")
def catalog():
    from planner.catalog import load_catalog

    return load_catalog(ROOT / "catalogs")


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present (shared/ is beside the repository in CI)")
    return path


@pytest.fixture(autouse=True)
def _analysis_in_process(monkeypatch):
    """Plans made by the suite answer their analysis in this process unless a test asks for ``jobs``: the default
    (several processes where the plan's solve is slow) would depend on the machine's speed, and tests that patch
    the planner's internals patch this process only. tests/test_analysis_workers.py asks for workers."""
    from planner import planning

    monkeypatch.setattr(planning, "PARALLEL_MIN_SOLVE_S", float("inf"))
    monkeypatch.setattr(planning, "PRESTART_MIN_WORKLOADS", float("inf"))
    monkeypatch.setattr(planning, "CANDIDATE_WORKER_MIN_WORKLOADS", float("inf"))
