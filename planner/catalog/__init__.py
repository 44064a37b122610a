"""Catalog layer: strict schemas for hardware and models, loading and cross-checking ``catalogs/``."""

from __future__ import annotations

from planner.catalog.loader import Catalog, default_catalog_dir, load_catalog
from planner.catalog.schemas import Efficiency, EngineEfficiency, HardwareSpec, ModelSpec

__all__ = [
    "Catalog",
    "Efficiency",
    "EngineEfficiency",
    "HardwareSpec",
    "ModelSpec",
    "default_catalog_dir",
    "load_catalog",
]
