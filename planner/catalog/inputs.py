"""One input layer for every file the planner reads: scenarios, catalog entries, measured-data CSV and JSON,
expert-load CSVs, Hugging Face configs.

Every reader refuses, with one line naming the file: a path that is not a regular file (a folder, a device, a
FIFO: an endless device file is never read until memory runs out), a file above a size limit, bytes that are
not UTF-8, YAML or JSON nested deeper than :data:`MAX_DEPTH`, and mappings that repeat a key (the last value
would otherwise win silently: a scenario could plan the wrong model). Numbers are checked by the schemas
(finite, within bounds).
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from planner.errors import InputError

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists accepted in YAML and JSON inputs."""
MAX_YAML_BYTES = 4_000_000
"""Scenarios and catalog entries are a few kB; 4 MB leaves room for long notes and generated files."""
MAX_DATA_BYTES = 256_000_000
"""Measured-data CSV and JSON files (the calibration files are 0.8-1.3 MB)."""
MAX_YAML_NODES = 200_000
"""YAML nodes (scalars, mappings, lists, aliases; an alias counts once: it shares its anchor's object)."""


def read_bytes(path: Path | str, *, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or :class:`InputError` naming the file."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: not a regular file (a device, pipe or socket is never read)")
    if st.st_size > limit:
        raise InputError(f"{path}: {st.st_size:,} bytes is larger than the {limit:,} bytes accepted for this kind of file")
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > limit:
        raise InputError(f"{path}: larger than the {limit:,} bytes accepted for this kind of file")
    return data


def read_text(path: Path | str, *, limit: int) -> str:
    """UTF-8 text of a regular file (a leading byte-order mark is dropped)."""
    data = read_bytes(path, limit=limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save the file as UTF-8"
        ) from None


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """Safe YAML (libyaml's C parser where PyYAML has it) that refuses repeated keys; depth and size are checked
    on the event stream before it composes (:func:`_check_shape`: the C composer recurses without a limit)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' appears twice in one mapping (the last value would win silently)",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads ``1e-6`` and ``2e9`` -- an exponent without a decimal point -- as strings; YAML 1.2
# and every person read them as numbers. The schemas take no string for a number, so the loader reads them as
# floats (the dotted forms are already floats).
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))

_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
_NODE = (yaml.MappingStartEvent, yaml.SequenceStartEvent, yaml.ScalarEvent, yaml.AliasEvent)


def _check_shape(text: str) -> None:
    """Refuse YAML nested deeper than :data:`MAX_DEPTH` or with more than :data:`MAX_YAML_NODES` nodes, on the
    parser's events (the parser keeps an explicit stack, so this never recurses)."""
    depth = nodes = 0
    for ev in yaml.parse(text, Loader=_StrictLoader):
        if isinstance(ev, _NODE):
            nodes += 1
            if nodes > MAX_YAML_NODES:
                raise yaml.constructor.ConstructorError(None, None, f"more than {MAX_YAML_NODES:,} nodes", None)
        if isinstance(ev, _OPEN):
            depth += 1
            if depth > MAX_DEPTH:
                raise yaml.constructor.ConstructorError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", ev.start_mark)
        elif isinstance(ev, _CLOSE):
            depth -= 1


MAX_DIGITS = 100
"""Longest run of digits a number in an input file may have (no physical quantity needs more)."""
_LONG_NUMBER = re.compile(r"\d{" + str(MAX_DIGITS + 1) + ",}")


def _check_numbers(path: Path | str, text: str) -> None:
    """Refuse an over-long number before a parser turns it into an int (Python refuses above 4,300 digits with
    an error that names no file): the file, the line and the bound."""
    m = _LONG_NUMBER.search(text)
    if m:
        line = text.count("\n", 0, m.start()) + 1
        raise InputError(f"{path}: line {line}: a number of {len(m.group()):,} digits; numbers have at most "
                         f"{MAX_DIGITS} digits (use an exponent, e.g. 1e12)")


def load_yaml(path: Path | str, *, limit: int = MAX_YAML_BYTES) -> Any:
    """Parse a YAML file under :class:`_StrictLoader`'s rules (safe types, no repeated keys, bounded depth and
    size); one-line :class:`InputError` on any problem."""
    text = read_text(path, limit=limit)
    _check_numbers(path, text)
    try:
        _check_shape(text)
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader (C or Python) subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', None) or exc})") from None


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key '{k}' appears twice in one object (the last value would win silently)")
        out[k] = v
    return out


def _depth(obj, limit: int) -> bool:
    """Whether ``obj`` nests at most ``limit`` levels (iterative, no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return False
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return True


def load_json(path: Path | str, *, limit: int = MAX_DATA_BYTES) -> Any:
    """Parse a JSON file: UTF-8, no repeated keys, at most :data:`MAX_DEPTH` levels, no NaN or Infinity."""
    text = read_text(path, limit=limit)
    _check_numbers(path, text)

    def no_constant(name):
        raise ValueError(f"'{name}' is not a JSON number")

    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=no_constant)
    except RecursionError:
        raise InputError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({str(exc).splitlines()[0]})") from None
    if not _depth(data, MAX_DEPTH):
        raise InputError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    return data


def read_csv(path: Path | str, *, limit: int = MAX_DATA_BYTES, **kwargs):
    """A CSV file as a DataFrame (UTF-8, size-limited), or :class:`InputError` naming the file."""
    import pandas as pd

    text = read_text(path, limit=limit)
    try:
        df = pd.read_csv(io.StringIO(text), **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise InputError(f"{path}: not a readable CSV ({str(exc).splitlines()[0]})") from None
    dup = [c for c in df.columns if str(c).endswith(tuple(f".{i}" for i in range(1, 10)))
           and str(c).rsplit(".", 1)[0] in df.columns]
    if dup:
        raise InputError(f"{path}: column '{str(dup[0]).rsplit('.', 1)[0]}' appears twice in the header")
    return df
