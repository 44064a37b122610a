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
