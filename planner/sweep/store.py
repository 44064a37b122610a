"""Sweep results as they finish: Parquet part files under ``OUT/parts/`` and what makes a sweep resumable.

Every finished batch of points is written as one part file (``part-<n>-<pid>.parquet``, atomically: written
under a temporary name, then renamed), so a sweep killed at any moment keeps every point it finished.
``parts/sweep-manifest.json`` records what the points were solved from (the scenario, the varied values,
the solver options, the catalog and the planner version); ``--resume`` reads the parts of a folder whose
manifest matches and solves only the points they do not hold. ``sweep.csv`` and the plots are made from the
parts (and the points just solved) when the sweep ends.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pandas as pd

from planner.catalog.writer import atomic_write_text
from planner.errors import InputError

PARTS = "parts"
MANIFEST = "sweep-manifest.json"
POINT = "point"
"""Column of a part file holding each row's index in the Cartesian product."""


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def catalog_digest(catalog) -> str:
    """Content hash of every catalog entry a sweep's points depend on (hardware with prices and fitted
    factors, models, engines)."""
    doc = {kind: {k: v.model_dump(mode="json") for k, v in sorted(getattr(catalog, kind).items())}
           for kind in ("hardware", "models", "engines")}
    return _sha(doc)


def sweep_identity(base: dict, varies, opts, catalog) -> dict:
    """What a sweep's points are solved from; a folder's parts are reused only when all of it matches."""
    from planner.version import __version__

    return {
        "planner": __version__,
        "scenario_sha256": _sha(base),
        "varies": [{"path": v.path, "values": list(v.values)} for v in varies],
        "options": {"time_limit_s": opts.time_limit_s, "mip_gap": opts.mip_gap, "engine": opts.engine},
        "catalog_sha256": catalog_digest(catalog),
    }


_WHAT = {"planner": "another planner version", "scenario_sha256": "another scenario (or an edited one)",
         "varies": "other --vary values", "options": "other --time-limit, --mip-gap or --engine",
         "catalog_sha256": "another catalog (or edited entries)"}


class PartStore:
    """The part files of one sweep folder."""

    def __init__(self, folder: Path, identity: dict, *, resume: bool, force: bool):
        self.folder = Path(folder) / PARTS
        self.identity = identity
        self._seq = 0
        manifest = self.folder / MANIFEST
        if self.folder.exists() and not self.folder.is_dir():
            raise InputError(f"{self.folder} is a file; the sweep keeps its part files in a folder of that name")
        if manifest.is_file():
            try:
                old = json.loads(manifest.read_text())
            except (OSError, ValueError):
                old = None
            if not self.done():
                pass  # a sweep that stopped before its first point (e.g. an unreachable scheduler): nothing to keep
            elif resume:
                if not isinstance(old, dict):
                    raise InputError(f"{manifest}: unreadable; it cannot say what the parts were solved from "
                                     "(start over with --force)")
                diff = [k for k in identity if old.get(k) != identity[k]]
                if diff:
                    was = f" (planner {old.get('planner')}, this is {identity['planner']})" if "planner" in diff else ""
                    raise InputError(
                        f"--resume: {self.folder} holds points of {', '.join(_WHAT[k] for k in diff)}{was}; "
                        "resume with the command that made them, or pass --force to start over")
            elif force:
                shutil.rmtree(self.folder)
            else:
                n = len(self.done())
                raise InputError(f"{self.folder} holds {n:,} points of an earlier sweep; pass --resume to solve only "
                                 "the missing points, or --force to start over")
        elif self.folder.is_dir() and any(self.folder.iterdir()) and not force:
            raise InputError(f"{self.folder} exists without {MANIFEST}; it is not a sweep's parts (move it, or pass "
                             "--force to replace it)")
        elif self.folder.is_dir() and force:
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(manifest, json.dumps(identity, indent=1) + "\n")

    def parts(self) -> list[Path]:
        return sorted(self.folder.glob("part-*.parquet"))

    def done(self) -> dict[int, dict]:
        """Rows already solved, by point index (a later part wins over an earlier one for the same point)."""
        out: dict[int, dict] = {}
        for f in self.parts():
            try:
                df = pd.read_parquet(f)
            except Exception:  # noqa: BLE001 - a torn or foreign file is skipped: its points are solved again
                continue
            for rec in df.to_dict("records"):
                i = int(rec.pop(POINT))
                # a part's columns are the union of its rows': a value a row never had reads back as NaN
                out[i] = {k: v for k, v in rec.items() if not (v is None or (isinstance(v, float) and v != v))}
        return out

    def write(self, rows: list[tuple[int, dict]]) -> Path | None:
        """One part file with ``rows`` (``(index, row)``), published atomically."""
        if not rows:
            return None
        df = pd.DataFrame([{POINT: i, **r} for i, r in rows])
        for c in df.columns:
            if df[c].dtype == object:  # mixed None / str / numbers: store as text, read back as such
                df[c] = df[c].map(lambda v: v if v is None or isinstance(v, str) else str(v))
        self._seq += 1
        name = f"part-{int(time.time() * 1e3):013d}-{os.getpid()}-{self._seq:05d}.parquet"
        tmp = self.folder / f".{name}.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, self.folder / name)
        return self.folder / name
