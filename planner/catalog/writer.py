"""Write catalog files atomically: model entries, and the ``efficiency`` block of hardware files.

The efficiency block is the last key of a hardware file; :func:`replace_efficiency_block` rewrites
it in place and leaves the datasheet part (and its comments) untouched.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from planner.catalog.schemas import Efficiency

MARK = "# --- efficiency: written by `planner calibrate fit`; datasheet values above stay untouched ---"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never a half-written file)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)


def efficiency_yaml(eff: Efficiency) -> str:
    data = eff.model_dump(mode="json")
    return dump_yaml({"efficiency": data})


def replace_efficiency_block(path: Path, eff: Efficiency) -> None:
    text = Path(path).read_text(encoding="utf-8")
    lines = text.splitlines()
    cut = len(lines)
    for i, line in enumerate(lines):
        if line.strip() == MARK or line.startswith("efficiency:"):
            cut = i
            break
    head = "\n".join(lines[:cut]).rstrip() + "\n"
    atomic_write_text(Path(path), head + MARK + "\n" + efficiency_yaml(eff))
