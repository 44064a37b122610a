"""The house's rules, checked on the code itself: the packages' layers (import-linter contracts in
pyproject.toml), no import cycle between modules, and no file opened by the physics or the model."""

from __future__ import annotations

import ast
import builtins
import io
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLANNER = ROOT / "planner"


def test_the_import_contracts_are_kept():
    """The layers in pyproject.toml ([tool.importlinter]): cli > sweep > export > pipeline > analysis > studies,
    calib > results > model > solve > perf > catalog > foundation, each importing only below it; perf, catalog,
    studies and calib never import Pyomo or HiGHS."""
    from importlinter import cli

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert cli.lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0
    finally:
        os.chdir(cwd)


def _imports() -> dict[str, set[str]]:
    """Module -> the planner modules it imports (at module level or inside a function), from the source."""
    out: dict[str, set[str]] = {}
    names = set()
    for f in PLANNER.rglob("*.py"):
        mod = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        names.add(mod.removesuffix(".__init__"))
    for f in PLANNER.rglob("*.py"):
        mod = ".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        deps = out.setdefault(mod, set())
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("planner"):
                for a in node.names:
                    deps.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in names else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("planner"))
        deps.discard(mod)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_through_others():
    """No import cycle between modules, lazy imports inside functions included (a package's ``__init__`` counts
    as the package: it may re-export its own modules, which must not import it back)."""
    graph = _imports()
    # a package's own modules importing names the package re-exports would be a cycle through __init__
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "read_csv", "read_parquet", "read_json",
              "loadtxt", "genfromtxt", "safe_load", "to_csv", "to_parquet", "mkdir", "unlink", "iterdir", "glob", "rglob",
              "listdir", "scandir", "walk"}
"""Calls that open, read, write or list files, by name."""
FILE_MODULES = {"np", "numpy", "json", "pickle", "yaml", "pd", "pandas", "os", "shutil"}
"""Modules whose ``load``, ``dump``, ``save`` and ``remove`` reach files."""


def _file_io(source: str) -> list[str]:
    """``line name`` of each call in ``source`` that reaches a file, and of each import of a file-handling module."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
            on_module = isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id in FILE_MODULES
            if name in FILE_CALLS or (on_module and name in {"load", "dump", "save", "savez", "remove", "rename"}):
                bad.append(f"{node.lineno} {name}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            bad += [f"{node.lineno} imports {m}" for m in mods
                    if m.split(".")[0] in {"pathlib", "shutil", "tempfile", "yaml", "csv"}
                    or m.startswith(("planner.catalog.loader", "planner.catalog.inputs", "planner.catalog.writer"))]
    return bad


def test_the_file_io_finder_finds_file_io():
    src = "import yaml\nx = open('a')\ny = np.load('b')\nz = s.replace('a', 'b')\nsolver.load(m)\np.read_text()\n"
    assert _file_io(src) == ["1 imports yaml", "2 open", "3 load", "6 read_text"]


@pytest.mark.parametrize("package", ["model", "perf"])
def test_the_model_and_the_physics_open_no_files(package):
    """``model/`` and ``perf/`` take their inputs as objects (the catalog reads files): no call in them opens,
    reads, writes or lists a file, and none imports a module that does file I/O for them."""
    bad = [f"{f.relative_to(ROOT)}:{line}" for f in (PLANNER / package).rglob("*.py") for line in _file_io(f.read_text())]
    assert bad == []


def test_building_a_model_and_evaluating_candidates_open_no_file(monkeypatch):
    """At run time too: with every ``open`` refused, candidates are evaluated and the model built from a resolved
    scenario (the catalog read before); the model then solves."""
    from planner.catalog import load_catalog
    from planner.catalog.scenario import Scenario, resolve_scenario
    from planner.model import build_model, prepare
    from planner.perf.candidates import evaluate_candidates, scenario_slos, select_candidates
    from planner.solve import Solver

    sc = Scenario.model_validate({
        "name": "t", "model": "llama-3.1-8b", "hardware": ["h100-sxm"], "weights": ["fp8"], "kv_cache": ["fp8"],
        "serving": ["aggregated"],
        "workloads": [{"name": "chat", "requests_per_s": 20, "input_tokens": 1000, "output_tokens": 200,
                       "slo": {"ttft_ms": 2000, "tpot_ms": 50}}]})
    rs = resolve_scenario(sc, load_catalog())
    slos = scenario_slos(sc.workloads)
    evaluate_candidates(rs, None, [slos])  # warm any lazy import of the modules themselves

    def refuse(*a, **k):
        raise AssertionError(f"opened {a[:1]}")

    with monkeypatch.context() as mp:
        mp.setattr(builtins, "open", refuse)
        mp.setattr(io, "open", refuse)
        table = select_candidates(evaluate_candidates(rs, None, [slos]), slos)
        m = build_model(prepare(rs, table))
    assert Solver(time_limit_s=30).solve(m).has_solution  # HiGHS's own output streams may open what they need


MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 120


def test_modules_and_functions_stay_readable():
    """No module over 700 lines and no function over 120 (a newcomer reads one in a sitting)."""
    long_modules, long_functions = [], []
    for f in PLANNER.rglob("*.py"):
        text = f.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(str(f.relative_to(ROOT)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                long_functions.append(f"{f.relative_to(ROOT)}:{node.name}")
    assert long_modules == [] and long_functions == []
