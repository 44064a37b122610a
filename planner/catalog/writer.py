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
from planner.errors import InputError

MARK = "# --- efficiency: written by `planner calibrate fit`; datasheet values above stay untouched ---"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never a half-written file)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def user_umask() -> int:
    """The process umask, read without changing it where Linux tells it (``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def refuse_link(path: Path) -> None:
    """The planner never writes through (or replaces) a symbolic link: say so instead."""
    if Path(path).is_symlink():
        raise InputError(f"{path} is a symbolic link; the planner does not write through links: remove it or choose another path")


def atomic_write_with(path: Path, write) -> None:
    """Create ``path`` whole: ``write(tmp)`` fills a temporary file beside it (same suffix, so tools that
    choose a format by extension still work), which then gets the user's umask mode (not 0600) and is
    renamed over ``path``. A symbolic link at ``path`` is refused."""
    path = Path(path)
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="planner-tmp-", suffix=path.suffix, dir=path.parent)
    try:
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o666 & ~user_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""

    def fill(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    atomic_write_with(path, fill)


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
