"""Writing what the planner produces without losing what a user owns.

Every command that writes files goes through here:

- :func:`check_file` / :func:`check_folder` run before any solve, so a bad ``--out``, ``--lp`` or
  ``--map`` costs a second, not a whole solve: refused when it exists (without ``--force``), is a
  symbolic link, is the wrong kind (a file where a folder goes), or its folder cannot be written.
- :func:`staged` collects a command's outputs in a temporary folder beside the target and publishes
  them only when all were written. A *unit* folder (a plan, a sweep) is swapped in whole, under a lock,
  with one ``rename`` that exchanges the old and the new folder, so a reader sees the old plan or the
  new one, never plan.json of one run beside plan.md of another. The folder lists the files the planner
  wrote in ``.planner-manifest.json``; a user's own files in it are carried over, and ``--force`` replaces
  only the files listed there. A shared folder (``docs/``) gets its files one by one, each atomically,
  after every one was checked.

Files are created with the user's umask (``catalog.writer``), never through a symbolic link.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from planner.catalog.writer import atomic_write_text, refuse_link, user_umask
from planner.errors import InputError

MANIFEST = ".planner-manifest.json"


def _writable_ancestor(path: Path, option: str) -> None:
    """The nearest existing ancestor of ``path`` must be a folder this process can create files in."""
    p = Path(os.path.abspath(path)).parent
    while not p.exists():
        if p.is_symlink():  # dangling link on the way
            raise InputError(f"{option} {path}: {p} is a broken symbolic link")
        p = p.parent
    if not p.is_dir():
        raise InputError(f"{option} {path}: {p} is a file, not a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: cannot create files in {p} (permission denied)")


def check_file(path: Path, *, force: bool, option: str, force_flag: str = "--force") -> Path:
    """Refuse an output file before any work: a link, a folder, an existing file without ``force``, or a
    place that cannot be written."""
    path = Path(path)
    if path.is_symlink():
        raise InputError(f"{option} {path} is a symbolic link; the planner does not write through links: "
                         "remove it or choose another path")
    if path.is_dir():
        raise InputError(f"{option} {path} is a folder; give a file name")
    if path.exists() and not force:
        raise InputError(f"{option} {path} exists; pass {force_flag} to overwrite it")
    if path.exists() and not os.access(path.parent, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: cannot replace it (folder not writable)")
    _writable_ancestor(path, option)
    return path


def check_folder(path: Path, *, option: str) -> Path:
    """Refuse an output folder before any work: a file, a link, or a place that cannot be written."""
    path = Path(path)
    if path.is_symlink():
        raise InputError(f"{option} {path} is a symbolic link; the planner does not write through links: "
                         "give the real folder")
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} {path} is a file, not a folder; give a folder")
    if path.exists() and not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: cannot write in it (permission denied)")
    _writable_ancestor(path, option)
    return path


def inside(root: Path, rel: str) -> Path:
    """``root / rel``, refused unless it stays inside ``root``: no absolute path, no ``..``, no link on the
    way out (names come from plan.json, which a user may have edited)."""
    parts = Path(rel).parts
    if not rel or Path(rel).is_absolute() or any(p in ("..", ".", "") for p in parts) or "\x00" in rel:
        raise InputError(f"output file '{rel}' would be written outside the output folder; refused")
    target = Path(os.path.abspath(root / rel))
    base = Path(os.path.abspath(root))
    if base not in target.parents:
        raise InputError(f"output file '{rel}' would be written outside {root}; refused")
    return target


def owned_files(folder: Path, legacy: Callable[[Path], set[str]] | None = None) -> set[str]:
    """Names (relative paths) of the files the planner wrote in ``folder``: its manifest, or for a folder
    written before manifests existed, what ``legacy`` recognises."""
    man = folder / MANIFEST
    if man.is_file() and not man.is_symlink():
        try:
            doc = json.loads(man.read_text(encoding="utf-8"))
            files = doc.get("files", []) if isinstance(doc, dict) else []
            return {str(f) for f in files if isinstance(f, str)}
        except (OSError, ValueError):
            raise InputError(f"{man}: unreadable manifest; remove it to let the planner treat the folder as new") from None
    return legacy(folder) if legacy is not None and folder.is_dir() else set()


def _tree(folder: Path) -> list[str]:
    """Relative paths of the regular files under ``folder`` (the staged outputs)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@contextlib.contextmanager
def _lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on the folder that holds the target (one planner writing there at a time)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write(f"waiting for another planner run writing in {folder} ...\n")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system has no such call (the caller then renames twice)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP if hasattr(errno, "ENOTSUP") else errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _carry(src: Path, dst: Path) -> None:
    """Put a user's entry of the old folder into the new one: a hard link for a file (the old name goes
    away with the old folder), a move for anything else."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_file() and not src.is_symlink():
        try:
            os.link(src, dst)
            return
        except OSError:
            shutil.copy2(src, dst)
            return
    os.rename(src, dst)


def _publish_unit(stage: Path, target: Path, *, force: bool, legacy, kind: str) -> list[Path]:
    new = _tree(stage)
    if target.exists():
        old = owned_files(target, legacy)
        clash = sorted(n for n in (set(new) | old) if (target / n).exists() or (target / n).is_symlink())
        if clash and not force:
            raise InputError(f"{target / clash[0]} exists; pass --force to replace the {kind}, or choose another --out")
        # a user's own entries (not written by the planner, not named like a new output) stay in the folder
        for entry in sorted(target.iterdir()):
            if entry.name == MANIFEST or entry.name in old or entry.name in new:
                continue
            if any(n.startswith(entry.name + "/") for n in (*new, *old)):
                continue  # the unit layouts are flat; a planner sub-folder is replaced with the unit
            _carry(entry, stage / entry.name)
    atomic_write_text(stage / MANIFEST, json.dumps({"written_by": "planner", "kind": kind, "files": new}, indent=1) + "\n")
    os.chmod(stage, 0o777 & ~user_umask())
    if not target.exists():
        os.rename(stage, target)
        return [target / n for n in new]
    os.chmod(stage, target.stat().st_mode & 0o7777)
    if _exchange(stage, target):
        shutil.rmtree(stage, ignore_errors=True)  # the old folder now sits at the staging name
    else:
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rmdir(aside)
        os.rename(target, aside)
        os.rename(stage, target)
        shutil.rmtree(aside, ignore_errors=True)
    return [target / n for n in new]


def _publish_files(stage: Path, target: Path, *, force: bool) -> list[Path]:
    new = _tree(stage)
    for n in new:
        dest = target / n
        refuse_link(dest)
        if dest.is_dir():
            raise InputError(f"{dest} is a folder; the planner wants to write a file there")
        if dest.exists() and not force:
            raise InputError(f"{dest} exists; pass --force to overwrite it")
    out = []
    for n in new:
        dest = target / n
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / n, dest)
        out.append(dest)
    return out


@contextlib.contextmanager
def staged(target: Path, *, force: bool, unit: bool, kind: str = "plan",
           legacy: Callable[[Path], set[str]] | None = None, written: list[Path] | None = None) -> Iterator[Path]:
    """Yield a temporary folder to write outputs into; publish them into ``target`` when the block ends
    without an error (``unit``: swap the whole folder; else file by file), discard them otherwise. The
    published paths are appended to ``written``."""
    target = Path(target)
    check_folder(target, option="--out")
    parent = Path(os.path.abspath(target)).parent
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=parent))
    try:
        yield stage
        with _lock(parent):
            paths = (_publish_unit(stage, target, force=force, legacy=legacy, kind=kind) if unit
                     else _publish_files(stage, target, force=force))
        if written is not None:
            written.extend(paths)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
