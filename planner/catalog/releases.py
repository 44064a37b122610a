"""The engine release an export targets: its flag table and its start-up rules, read from ``engines/releases/``.

A flag table (``<engine>-<version>.flags.json.gz``) is what ``tests/data/engine_flags_from_wheel.py`` read from the
release's own package. The rules (``rules.yaml``) are the cross-flag conditions the engines check at start-up, each
with the source file and line it was read from (``shared/reference/engine-rules.md``); ``covers`` names the releases
whose rules were read. :mod:`planner.export.checks` evaluates both against every exported command.
"""

from __future__ import annotations

import ast
import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from planner.catalog.fields import Strict
from planner.catalog.loader import Catalog, bundled_catalog_dir, format_validation_error, read_yaml
from planner.catalog.schemas import EngineSpec
from planner.errors import InputError

RULES_FILE = "rules.yaml"


class Rule(Strict):
    """One start-up condition of one engine release: where ``when`` holds, ``require`` must hold too."""

    id: str = Field(pattern=r"^[a-z0-9]+\.[a-z0-9.-]+$")
    engine: str
    versions: list[str] = Field(min_length=1)
    scope: Literal["command", "pair", "metrics"] = "command"
    """``command``: one launch command (its flags, its ``--config`` YAML, its environment, the pool's facts);
    ``pair``: a prefill pool and the decode pool it hands KV to (``prefill_*`` / ``decode_*`` functions);
    ``metrics``: the metric names the export's monitors and alerts read for a pool of the engine."""
    vars: dict[str, str] = Field(default_factory=dict)
    """Named expressions evaluated in order before ``when`` and ``require`` (each can use the ones before)."""
    when: str = "True"
    require: str
    message: str = Field(min_length=5)
    """What the engine says or does when ``require`` fails (quoted where the source has a message)."""
    source: str = Field(min_length=5)
    """File (and line) of the engine release the condition was read from."""

    @model_validator(mode="after")
    def _expressions(self) -> Rule:
        for where, expr in [("when", self.when), ("require", self.require), *self.vars.items()]:
            try:
                ast.parse(expr, mode="eval")
            except SyntaxError as e:
                raise ValueError(f"rule {self.id}: '{where}' is not an expression ({e.msg})") from None
        return self


class RulesFile(Strict):
    covers: dict[str, list[str]]
    """Engine -> releases whose start-up rules were read: an export to any other release is refused."""
    source: str
    as_of: str
    rules: list[Rule]


@dataclass(frozen=True)
class FlagTable:
    engine: str
    version: str
    syntax: str
    """``argparse`` (SGLang), ``argparse-underscores`` (vLLM's parser also takes ``_`` for ``-``), ``click``."""
    flags: dict[str, dict]
    names: dict[str, str]
    """Every spelling (flag, alias, ``--no-`` form) -> the flag's entry key."""
    source: dict
    config_fields: dict[str, list[str]] | None = None
    """Fields of the engine's ``--config`` YAML per dotted section ("": top level), where the table has them."""

    def canonical(self, option: str) -> str | None:
        if option in self.names:
            return self.names[option]
        if self.syntax == "argparse-underscores" and option.startswith("--"):
            return self.names.get("--" + option[2:].replace("_", "-"))
        return None


def _release_dir(catalog: Catalog, engine: EngineSpec) -> list[Path]:
    """Where the engine's release files may live: beside the engine's own YAML, then the bundled catalog."""
    dirs = []
    own = catalog.files.get(engine.id)
    if own is not None:
        dirs.append(Path(own).parent / "releases")
    dirs.append(bundled_catalog_dir() / "engines" / "releases")
    return dirs


def _find(catalog: Catalog, engine: EngineSpec, name: str) -> Path:
    for d in _release_dir(catalog, engine):
        if (d / name).is_file():
            return d / name
    raise InputError(f"engine '{engine.id}': release file '{name}' not found in engines/releases/ (regenerate it with "
                     f"tests/data/engine_flags_from_wheel.py)")


def release_of(engine: EngineSpec):
    if engine.release is None:
        raise InputError(f"engine '{engine.id}': no 'release' in its catalog entry: the export needs the version, "
                         f"images and flag table it targets (add a release block)")
    return engine.release


def flag_table(catalog: Catalog, engine: EngineSpec, *, router: bool = False) -> FlagTable | None:
    """The release's flag table (``router``: its PD router's, None where the catalog names none)."""
    rel = release_of(engine)
    name = rel.router_flags if router else rel.flags
    if name is None:
        return None
    return _flag_table(str(_find(catalog, engine, name)), engine.id + ("-router" if router else ""), rel.version)


@lru_cache(maxsize=16)
def _flag_table(path: str, engine: str, version: str) -> FlagTable:
    try:
        doc = json.loads(gzip.decompress(Path(path).read_bytes()))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a gzipped JSON flag table ({e})") from None
    flags = doc.get("flags") or {}
    names: dict[str, str] = {}
    for key, entry in flags.items():
        for spelling in [key, *(entry.get("aliases") or [])]:
            names[spelling] = key
    return FlagTable(engine=engine, version=version, syntax=doc.get("syntax", "argparse"), flags=flags, names=names,
                     source=doc.get("source", {}), config_fields=doc.get("config_fields"))


def rules_path(catalog: Catalog, engine: EngineSpec) -> Path:
    return _find(catalog, engine, RULES_FILE)


def rules_for(catalog: Catalog, engine: EngineSpec) -> list[Rule]:
    """The rules of the engine's release; an :class:`InputError` where its rules were never read."""
    rel = release_of(engine)
    path = _find(catalog, engine, RULES_FILE)
    doc = _rules_file(str(path))
    if rel.version not in doc.covers.get(engine.id, []):
        read = ", ".join(doc.covers.get(engine.id, [])) or "none"
        raise InputError(f"engine '{engine.id}' release {rel.version}: no start-up rules read for this version "
                         f"({path} covers {read}); target a covered release or add its rules")
    return [r for r in doc.rules if r.engine == engine.id and rel.version in r.versions]


@lru_cache(maxsize=4)
def _rules_file(path: str) -> RulesFile:
    try:
        return RulesFile.model_validate(read_yaml(Path(path)))
    except ValidationError as e:
        raise InputError(format_validation_error(path, e)) from None
