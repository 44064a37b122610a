"""Load and cross-check the YAML catalogs (one entity per file).

Errors are :class:`planner.errors.InputError` with one line naming the file and the field.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from planner.catalog.schemas import EngineSpec, HardwareSpec, ModelSpec
from planner.errors import InputError

T = TypeVar("T", bound=BaseModel)


def bundled_catalog_dir() -> Path:
    """The catalog that ships with the package: ``planner/_catalogs`` in an installed wheel, the repository's
    ``catalogs/`` in a checkout."""
    pkg = Path(__file__).resolve().parents[1]
    wheel = pkg / "_catalogs"
    if wheel.is_dir():
        return wheel
    return pkg.parent / "catalogs"


def default_catalog_dir() -> Path | None:
    """``$PLANNER_CATALOG_DIR`` (layered over the bundled catalog), else None: the bundled catalog alone."""
    env = os.environ.get("PLANNER_CATALOG_DIR")
    return Path(env) if env else None


def format_validation_error(path: Path | str, err: ValidationError) -> str:
    """One line: file, dotted field path, what is wrong (first error; count of the rest)."""
    errs = err.errors()
    first = errs[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field (remove it or fix its spelling)"
    elif first["type"] == "missing":
        msg = "missing field (add it)"
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"{path}: field '{loc}': {msg}{more}"


def read_yaml(path: Path) -> Any:
    """A YAML file through the one input layer (UTF-8, size and depth limits, repeated keys refused)."""
    from planner.catalog.inputs import load_yaml

    return load_yaml(path)


def parse_entry(path: Path, cls: type[T]) -> T:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of fields at top level")
    try:
        obj = cls.model_validate(data)
    except ValidationError as err:
        raise InputError(format_validation_error(path, err)) from None
    ident = getattr(obj, "id", None)
    if ident is not None and ident != path.stem:
        raise InputError(f"{path}: field 'id': '{ident}' must match the file name '{path.stem}'")
    return obj


def unknown_id_message(kind: str, ident: str, known: Iterable[str]) -> str:
    known = sorted(known)
    close = difflib.get_close_matches(ident, known, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known)}"
    return f"unknown {kind} id '{ident}' ({hint})"


@dataclass(frozen=True)
class Catalog:
    """Hardware and model entries, with lookups by id, alias and Hugging Face id."""

    root: Path
    hardware: dict[str, HardwareSpec]
    models: dict[str, ModelSpec]
    files: dict[str, Path] = field(default_factory=dict)
    engines: dict[str, EngineSpec] = field(default_factory=dict)
    layered: bool = False
    """``root``'s entries over the bundled catalog (False: the bundled catalog alone, or ``root`` alone)."""

    def get_hardware(self, ident: str) -> HardwareSpec:
        key = self.hardware_id(ident)
        if key is None:
            raise InputError(unknown_id_message("hardware", ident, self.hardware))
        return self.hardware[key]

    def get_model(self, ident: str) -> ModelSpec:
        key = self.model_id(ident)
        if key is None:
            raise InputError(unknown_id_message("model", ident, self.models))
        return self.models[key]

    def get_engine(self, ident: str) -> EngineSpec:
        key = self.engine_id(ident)
        if key is None:
            raise InputError(unknown_id_message("engine", ident, self.engines))
        return self.engines[key]

    def engine_id(self, name: str) -> str | None:
        """Catalog id for an engine id or alias (case-insensitive), or None."""
        n = name.strip().lower()
        if n in self.engines:
            return n
        for e in self.engines.values():
            if n in (a.lower() for a in e.aliases):
                return e.id
        return None

    def engines_for(self, hw: HardwareSpec) -> list[EngineSpec]:
        """Engines that run on ``hw``, in catalog order."""
        return [e for e in self.engines.values() if e.runs_on(hw)]

    def hardware_id(self, name: str) -> str | None:
        """Catalog id for an id or an alias (case-insensitive), or None."""
        n = name.strip().lower()
        if n in self.hardware:
            return n
        for hw in self.hardware.values():
            if n in (a.lower() for a in hw.aliases):
                return hw.id
        return None

    def model_id(self, name: str) -> str | None:
        """Catalog id for an id or a Hugging Face id (case-insensitive), or None."""
        n = name.strip().lower()
        if n in self.models:
            return n
        for m in self.models.values():
            if n in (h.lower() for h in [*m.hf_ids, *m.aliases]):
                return m.id
        return None


def _load_dir(root: Path, sub: str, cls: type[T]) -> tuple[dict[str, T], dict[str, Path]]:
    """Every ``*.yaml`` entry of ``root/sub`` by id (an absent folder has none)."""
    out: dict[str, T] = {}
    files: dict[str, Path] = {}
    d = root / sub
    if d.exists() and not d.is_dir():
        raise InputError(f"{d}: expected a folder of {sub} YAML files")
    for path in sorted(d.glob("*.yaml")) if d.is_dir() else []:
        obj = parse_entry(path, cls)
        if obj.id in out:  # type: ignore[attr-defined]
            raise InputError(f"{path}: field 'id': '{obj.id}' is also defined by {files[obj.id]}")  # type: ignore[attr-defined]
        out[obj.id] = obj  # type: ignore[attr-defined]
        files[obj.id] = path  # type: ignore[attr-defined]
    return out, files


def cross_check(
    hardware: dict[str, HardwareSpec],
    models: dict[str, ModelSpec],
    files: dict[str, Path],
    engines: dict[str, EngineSpec] | None = None,
) -> None:
    """Aliases and Hugging Face ids must each name one entry; fitted engines must be catalog engines."""
    engines = engines or {}
    seen: dict[str, str] = {}
    for e in engines.values():
        for name in [e.id, *e.aliases]:
            k = name.lower()
            if k in seen and seen[k] != e.id:
                raise InputError(f"{files[e.id]}: field 'aliases': '{name}' also names engine '{seen[k]}'")
            seen[k] = e.id
    if engines:
        for hw in hardware.values():
            for eng in hw.efficiency.by_engine:
                if eng not in engines:
                    raise InputError(
                        f"{files[hw.id]}: field 'efficiency.by_engine.{eng}': "
                        f"{unknown_id_message('engine', eng, engines)}"
                    )
    seen = {}
    for hw in hardware.values():
        for name in [hw.id, *hw.aliases]:
            k = name.lower()
            if k in seen and seen[k] != hw.id:
                raise InputError(f"{files[hw.id]}: field 'aliases': '{name}' also names '{seen[k]}'")
            seen[k] = hw.id
    seen = {}
    for m in models.values():
        for name in [m.id, *m.hf_ids, *m.aliases]:
            k = name.lower()
            if k in seen and seen[k] != m.id:
                raise InputError(f"{files[m.id]}: field 'hf_ids': '{name}' also listed by '{seen[k]}'")
            seen[k] = m.id


def load_catalog(root: Path | str | None = None, *, alone: bool = False) -> Catalog:
    """The catalog: the bundled one with the entries of ``root`` (default: ``$PLANNER_CATALOG_DIR``) layered
    over it. A file of ``root`` whose id is a bundled entry's replaces that entry; other files add entries.
    ``alone``: ``root``'s files only (engines fall back to the bundled ones where ``root`` has none)."""
    if root is None:
        root = default_catalog_dir()
    if root is not None and not Path(root).is_dir():
        raise InputError(f"{root}: catalog folder not found (give a folder with hardware/, models/ or engines/)")
    return _load_cached(None if root is None else str(Path(root)), alone and root is not None)


@lru_cache(maxsize=8)
def _load_cached(root_s: str | None, alone: bool) -> Catalog:
    bundled = bundled_catalog_dir()
    layers = [Path(root_s)] if alone else [bundled] + ([Path(root_s)] if root_s is not None else [])
    if not any((d / "hardware").is_dir() for d in layers):
        raise InputError(f"{layers[-1]}: no hardware/ folder in the catalog (pass --catalog with one, or drop --catalog-alone)")
    parts: dict[str, tuple[dict, dict]] = {}
    for sub, cls in (("hardware", HardwareSpec), ("models", ModelSpec), ("engines", EngineSpec)):
        entries: dict = {}
        files: dict = {}
        for d in layers:
            e, f = _load_dir(d, sub, cls)
            entries.update(e)
            files.update(f)
        if sub == "engines" and not entries:  # a folder of its own without engines/ runs the bundled engines
            entries, files = _load_dir(bundled, sub, cls)
        parts[sub] = (entries, files)
    (hardware, hfiles), (models, mfiles), (engines, efiles) = parts["hardware"], parts["models"], parts["engines"]
    files = {**hfiles, **mfiles, **efiles}
    cross_check(hardware, models, files, engines)
    return Catalog(root=Path(root_s) if root_s is not None else bundled, hardware=hardware, models=models,
                   files=files, engines=engines, layered=not alone and root_s is not None)


def clear_cache() -> None:
    _load_cached.cache_clear()
