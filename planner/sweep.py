"""Sensitivity sweeps: re-solve a scenario over the Cartesian product of varied inputs.

Points are grouped so that work is shared:

- the evaluated candidate pool (the expensive part) depends on the scenario without its SLOs and
  without the inputs that are mutable parameters of the MILP; one evaluation per such group;
- the candidate table and the Pyomo model depend on the SLOs too; one build per group;
- demand, prefix working sets, prices, unit limits, power and budget are mutable parameters: the
  model is updated in place (:func:`planner.model.build.update_parameters`) and the persistent HiGHS
  instance re-solves it.

Workers (``jobs``) take contiguous chunks of the sorted points, so each builds every group once.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from planner.catalog.loader import Catalog, format_validation_error
from planner.catalog.scenario import ResolvedScenario, Scenario, resolve_scenario
from planner.errors import InfeasibleError, InputError, PlannerError
from planner.model import build_model, prepare
from planner.model.build import update_parameters
from planner.model.data import drop_unpowered
from planner.model.families import FAMILIES
from planner.perf.candidates import evaluate_candidates, prefix_shares, scenario_slos, select_candidates
from planner.planning import PlanOptions, diagnose_candidates, diagnose_limits
from planner.results import extract, solution_values
from planner.solve import Solver

_CHUNK_LOCK = threading.Lock()

MUTABLE = ("requests_per_s", "working_set_gb", "prices", "max_units", "power_kw", "budget_usd_per_hour")


# --------------------------------------------------------------------------------------------------
# Parsing --vary


@dataclass(frozen=True)
class Vary:
    path: str
    values: tuple[float, ...]


MAX_POINTS_PER_VARY = 1_000_000
"""Values one ``--vary`` range may generate (the product of all of them is capped by ``--max-points``)."""


def parse_values(text: str, flag: str = "--vary") -> tuple[float, ...]:
    """``100,200,400`` or ``lo:hi:log:n`` / ``lo:hi:lin:n``."""
    text = text.strip()
    parts = text.split(":")
    try:
        if len(parts) == 4:
            lo, hi, kind, n = float(parts[0]), float(parts[1]), parts[2].strip().lower(), int(parts[3])
            if n < 1:
                raise ValueError
            if n > MAX_POINTS_PER_VARY:
                raise InputError(f"{flag}: {n:,} values in one range; at most {MAX_POINTS_PER_VARY:,}")
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise InputError(f"{flag}: range ends must be finite numbers, got '{text}'")
            if kind == "log":
                if lo <= 0 or hi <= 0:
                    raise InputError(f"{flag}: a log range needs positive ends, got '{text}'")
                vals = np.geomspace(lo, hi, n)
            elif kind == "lin":
                vals = np.linspace(lo, hi, n)
            else:
                raise ValueError
        elif len(parts) == 1:
            vals = np.array([float(v) for v in text.split(",") if v.strip()])
            if vals.size == 0:
                raise ValueError
            if not np.isfinite(vals).all():
                raise InputError(f"{flag}: values must be finite numbers, got '{text}'")
        else:
            raise ValueError
    except ValueError:
        raise InputError(
            f"{flag}: values must be a list (100,200,400) or a range lo:hi:log:n or lo:hi:lin:n, got '{text}'"
        ) from None
    return tuple(float(v) for v in vals)


def parse_vary(spec: str) -> Vary:
    path, eq, vals = spec.partition("=")
    if not eq or not path.strip():
        raise InputError(f"--vary: expected PATH=VALUES (e.g. workloads.chat.requests_per_s=100,200), got '{spec}'")
    return Vary(path.strip(), parse_values(vals, f"--vary {path.strip()}"))


def set_path(doc: dict, path: str, value) -> None:
    """Set a dotted ``path`` in a scenario mapping; list items (workloads) are addressed by name."""
    keys = path.split(".")
    node = doc
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, list):
            match = [x for x in node if isinstance(x, dict) and x.get("name") == k]
            if not match:
                names = ", ".join(str(x.get("name")) for x in node if isinstance(x, dict))
                raise InputError(f"--vary {path}: no item named '{k}' (have: {names})")
            if last:
                raise InputError(f"--vary {path}: points at a whole item; name a field inside it")
            node = match[0]
            continue
        if not isinstance(node, dict):
            raise InputError(f"--vary {path}: '{'.'.join(keys[:i])}' is a value, not a group of fields")
        if last:
            node[k] = value
        else:
            if node.get(k) is None:
                node[k] = {}
            node = node[k]


def _typed(value: float):
    return int(value) if float(value).is_integer() else value


MAX_POINTS = 10_000
"""Points a sweep runs unless ``--max-points`` raises the cap (each point is a MILP solve)."""


def count_points(varies: list[Vary]) -> int:
    return math.prod(len(v.values) for v in varies)


def _apply(base: dict, pairs) -> tuple[dict, dict]:
    doc = copy.deepcopy(base)
    inputs = {}
    for v, val in pairs:
        set_path(doc, v.path, _typed(val))
        inputs[v.path] = val
    return inputs, doc


def _level(base: dict, v: Vary) -> int:
    """How much of the work a vary invalidates: 0 the evaluated candidates, 1 the Pyomo model (SLOs),
    2 only mutable parameters (demand, prices, limits)."""
    if len(v.values) < 2:
        return 2
    keys = [keys_of(_apply(base, [(v, x)])[1]) for x in v.values[:2]]
    return 0 if keys[0][0] != keys[1][0] else 1 if keys[0][1] != keys[1][1] else 2


def iter_points(base: dict, varies: list[Vary]) -> Iterator[tuple[int, dict, dict]]:
    """``(index, inputs, scenario mapping)`` for every point of the Cartesian product, generated one at a
    time (never all at once). ``index`` is the point's position in the product taken in ``varies`` order
    (the last vary fastest); points come out with the inputs that change the evaluated candidates outermost
    and mutable parameters innermost, so consecutive points share their candidate pool and model."""
    order = sorted(range(len(varies)), key=lambda k: _level(base, varies[k]))
    strides = [math.prod(len(v.values) for v in varies[k + 1:]) for k in range(len(varies))]
    for combo in itertools.product(*(range(len(varies[k].values)) for k in order)):
        idx = sum(strides[k] * c for k, c in zip(order, combo, strict=True))
        picks = sorted(zip(order, combo, strict=True))
        inputs, doc = _apply(base, [(varies[k], varies[k].values[c]) for k, c in picks])
        yield idx, inputs, doc


def point_scenarios(base: dict, varies: list[Vary]) -> list[tuple[dict, dict]]:
    """``(inputs, scenario mapping)`` for every point, in product order (small sweeps and tests)."""
    pts = sorted(iter_points(base, varies), key=lambda t: t[0])
    return [(inputs, doc) for _, inputs, doc in pts]


def sweep_shares(base: dict, varies: list[Vary]) -> dict[str, tuple[float, float]] | None:
    """The range of prefix working set per request/s each workload takes over the sweep's points, for the
    candidate pruning of models whose demand and working sets the points change in place (a model built for
    one point serves them all); ``None`` where no vary moves a workload's demand or prefix cache (each
    point's own range is the scenario's). The share falls with demand and grows with the working set, so only
    each vary's smallest and largest value are combined (at most 2^k scenarios for k such varies, not the
    sweep's product; every combination where the schema refuses an extreme one). A combination the schema
    refuses is left to its point's own error."""
    rel = [v for v in varies if v.path.split(".")[0] == "workloads"
           and (v.path.endswith(".requests_per_s") or ".prefix_cache" in v.path)]
    if not rel:
        return None
    out, complete = _share_range(base, rel, itertools.product(*({min(v.values), max(v.values)} for v in rel)))
    if not complete:  # an extreme the schema refuses: every combination, as the points themselves
        out, _ = _share_range(base, rel, itertools.product(*(v.values for v in rel)))
    return out or None


def _share_range(base: dict, rel: list[Vary], combos) -> tuple[dict[str, tuple[float, float]], bool]:
    """:func:`sweep_shares` over ``combos``, and whether the schema accepted every one of them."""
    out: dict[str, tuple[float, float]] = {}
    complete = True
    for combo in combos:
        try:
            sc = Scenario.model_validate(_apply(base, list(zip(rel, combo, strict=True)))[1])
        except (ValidationError, InputError):
            complete = False
            continue
        for w, (lo, hi) in prefix_shares(sc.workloads).items():
            a, b = out.get(w, (lo, hi))
            out[w] = (min(a, lo), max(b, hi))
    return out, complete


def validate_point(doc: dict, catalog: Catalog, path: Path, inputs: dict) -> ResolvedScenario:
    where = ", ".join(f"{k}={_typed(v)}" for k, v in inputs.items())
    try:
        sc = Scenario.model_validate(doc)
    except ValidationError as err:
        raise InputError(format_validation_error(Path(f"{path} with {where}"), err)) from None
    return resolve_scenario(sc, catalog, path)


# --------------------------------------------------------------------------------------------------
# Grouping keys


def _blank(doc: dict, slos: bool) -> dict:
    """The scenario with mutable inputs replaced by what the structure depends on (whether they are
    set, and whether a working set is zero); with ``slos`` the SLOs blanked too."""
    d = copy.deepcopy(doc)
    for w in d.get("workloads", []):
        w.pop("requests_per_s", None)
        pc = w.get("prefix_cache") or {}
        if "working_set_gb" in pc:
            pc["working_set_gb"] = bool(pc["working_set_gb"])
        if slos:
            w.pop("slo", None)
    d["prices"] = sorted((d.get("prices") or {}).keys())
    lim = d.get("limits") or {}
    for f in FAMILIES:  # the limits a re-solve varies in place (mutable parameters): only whether they are set counts
        if f.sweepable and f.path and f.path.startswith("limits."):
            k = f.path.split(".")[1]
            lim[k] = sorted((lim.get(k) or {}).keys()) if isinstance(lim.get(k), dict) else lim.get(k) is not None
    d["limits"] = lim
    return d


def keys_of(doc: dict) -> tuple[str, str]:
    """(pool key, model key): points sharing a pool key share candidate evaluation; sharing a model
    key they share the Pyomo model too."""
    return (json.dumps(_blank(doc, True), sort_keys=True, default=str),
            json.dumps(_blank(doc, False), sort_keys=True, default=str))


# --------------------------------------------------------------------------------------------------
# Solving points


@dataclass
class _Group:
    table: object
    model: object
    solver: Solver


_POOLS: dict[str, tuple] = {}
_GROUPS: dict[str, _Group] = {}


def _workload_columns(plan, sc) -> dict:
    out = {}
    for w in sc.workloads:
        pools = [p for p in plan.pools if p.workload == w.name]
        wo = next(x for x in plan.workloads if x.name == w.name)
        out[f"{w.name}.hardware"] = "+".join(sorted({p.hardware for p in pools}))
        out[f"{w.name}.layout"] = "+".join(
            f"{p.role[0]}:{p.engine}:{p.layout.notation.replace(' ', '')}x{p.replicas}" for p in pools
        )
        out[f"{w.name}.batch"] = "+".join(str(p.batch) for p in pools)
        out[f"{w.name}.kv_tier"] = "+".join(sorted({p.kv_tier for p in pools}))
        out[f"{w.name}.ttft_ms"] = wo.ttft_s * 1e3
        out[f"{w.name}.tpot_ms"] = wo.tpot_s * 1e3
        out[f"{w.name}.tokens_per_s_per_user"] = 1.0 / wo.tpot_s if wo.tpot_s > 0 else math.nan
    return out


def solve_point(rs: ResolvedScenario, doc: dict, opts: PlanOptions) -> dict:
    """One point: reuse the evaluated pool and the built model of its group when there is one."""
    pool_key, model_key = keys_of(doc)
    t0 = time.perf_counter()
    build_s = update_s = solve_s = 0.0
    row: dict = {}
    try:
        rs2, _ = drop_unpowered(rs)
        if pool_key not in _POOLS:
            # points arrive grouped (see ``iter_points``): keep one evaluated pool and its models at a time
            _POOLS.clear()
            _GROUPS.clear()
            _POOLS[pool_key] = (evaluate_candidates(rs2, opts.engine, shares=opts.prefix_shares),)
        (pool,) = _POOLS[pool_key]
        grp = _GROUPS.get(model_key)
        if grp is None:
            table = select_candidates(pool, scenario_slos(rs2.scenario.workloads))
            diagnose_candidates(rs2, pool, table)
            data = prepare(rs2, table)
            model = build_model(data)
            grp = _Group(table, model, Solver(time_limit_s=opts.time_limit_s, mip_gap=opts.mip_gap,
                                              threads=opts.solver_threads))
            _GROUPS[model_key] = grp
            build_s = time.perf_counter() - t0
        else:
            diagnose_candidates(rs2, pool, grp.table)
            t1 = time.perf_counter()
            data = prepare(rs2, grp.table)
            update_parameters(grp.model, data)
            update_s = time.perf_counter() - t1
        res = grp.solver.solve(grp.model)
        solve_s = res.wall_s
        if res.status == "infeasible":
            raise InfeasibleError(diagnose_limits(data, opts))
        if not res.has_solution:
            row = {"status": "limit", "diagnosis": f"no plan within {opts.time_limit_s:g} s ({res.termination})"}
        else:
            x, u = solution_values(grp.model)
            plan = extract(rs2, data, x, u, res)
            o = plan.objective
            row = {"status": plan.status, "usd_per_hour": o.usd_per_hour, "usd_per_mtok": o.usd_per_mtok,
                   "usd_per_mtok_input": o.usd_per_mtok_input, "usd_per_mtok_output": o.usd_per_mtok_output,
                   "mip_gap": res.mip_gap, **_workload_columns(plan, rs2.scenario), "diagnosis": ""}
    except PlannerError as err:
        row = {"status": "infeasible" if isinstance(err, InfeasibleError) else "error", "diagnosis": str(err)}
    row.update({"build_s": build_s, "update_s": update_s, "solve_s": solve_s, "wall_s": time.perf_counter() - t0})
    return row


def _run_chunk(args) -> list[tuple[int, dict]]:
    """Solve a chunk of points in a worker: ``(points, catalog, scenario path, options)``; ``catalog`` is a
    :class:`Catalog` or the folder to load one from. One chunk at a time per process (the evaluated pools
    and built models are cached per process)."""
    points, catalog, path, opts = args
    with _CHUNK_LOCK:
        if not isinstance(catalog, Catalog):
            from planner.catalog import load_catalog

            root, alone = catalog if catalog is not None else (None, False)
            catalog = load_catalog(root, alone=alone)
        return [(idx, _solve_one(inputs, doc, catalog, path, opts)) for idx, inputs, doc in points]


def _solve_one(inputs: dict, doc: dict, catalog: Catalog, path: Path, opts: PlanOptions) -> dict:
    """One point's row; a combination of values the scenario schema refuses is an error row, not an abort."""
    try:
        rs = validate_point(doc, catalog, path, inputs)
    except PlannerError as err:
        return {**inputs, "status": "error", "diagnosis": str(err), "build_s": 0.0, "update_s": 0.0,
                "solve_s": 0.0, "wall_s": 0.0}
    return {**inputs, **solve_point(rs, doc, opts)}


def check_sweep(base: dict, path: Path, varies: list[Vary], catalog: Catalog, max_points: int = MAX_POINTS) -> int:
    """Refuse a sweep before any solving: too many points for ``max_points``, or a value the scenario
    schema refuses (each vary's values are checked one at a time against the base scenario)."""
    n = count_points(varies)
    if n > max_points:
        raise InputError(f"--vary: {n:,} points exceed --max-points {max_points:,} (each point is a MILP solve); "
                         "use fewer values or raise --max-points")
    validate_point(base, catalog, path, {})
    for v in varies:
        for x in v.values:
            inputs, doc = _apply(base, [(v, x)])
            validate_point(doc, catalog, path, inputs)
    return n


def iter_sweep(base: dict, path: Path, varies: list[Vary], catalog: Catalog, *, catalog_root: Path | None = None,
               jobs: int = 1, opts: PlanOptions | None = None, skip: set[int] | frozenset[int] = frozenset(),
               backend: str = "local", scheduler: str | None = None) -> Iterator[tuple[int, dict]]:
    """Solve every point not in ``skip`` and yield ``(index, row)`` as points finish (index: product order), so
    a caller can keep what is done when interrupted. Points stream from :func:`iter_points`; at most a few
    chunks per worker are in flight. ``backend`` ``local`` runs ``jobs`` worker processes here (one process:
    in this one); ``dask`` runs chunks on a Dask cluster (``scheduler``'s address, or a local cluster of
    ``jobs`` workers), one HiGHS thread per worker. A chunk whose worker dies or fails is retried once, then
    its points come back with status ``failed``."""
    opts = opts or PlanOptions(analysis=False)
    if opts.prefix_shares is None:
        opts = dataclasses.replace(opts, prefix_shares=sweep_shares(base, varies))
    _POOLS.clear()
    _GROUPS.clear()
    points = (p for p in iter_points(base, varies) if p[0] not in skip)
    total = count_points(varies) - len(skip)
    if total <= 0:
        return
    jobs = max(1, min(jobs, total))
    if backend == "local" and jobs == 1:
        for idx, inputs, doc in points:
            yield idx, _solve_one(inputs, doc, catalog, path, opts)
        return
    # contiguous chunks keep each group inside as few workers as possible; a few chunks per worker keep
    # the progress moving and bound the points held in memory
    size = max(1, min(64, math.ceil(total / (jobs * 4))))
    if backend == "dask":
        from planner.sweep_dask import DaskRunner

        runner = DaskRunner(scheduler, jobs, catalog)
        opts = dataclasses.replace(opts, solver_threads=1)
    else:
        runner = _LocalRunner(jobs, None if catalog_root is None else (catalog_root, not catalog.layered))
    try:
        pending: dict = {}
        while True:
            while len(pending) < runner.slots * 2:
                chunk = list(itertools.islice(points, size))
                if not chunk:
                    break
                pending[runner.submit(chunk, path, opts)] = (chunk, 1)
            if not pending:
                break
            for f in runner.wait(list(pending)):
                chunk, attempt = pending.pop(f)
                try:
                    rows = runner.result(f)
                except Exception as err:  # noqa: BLE001 - a worker's failure becomes rows, never a lost point
                    if attempt < 2:
                        # the retry runs apart, so a point that kills its worker again takes no other point with it
                        pending[runner.submit(chunk, path, opts, isolated=True)] = (chunk, attempt + 1)
                        continue
                    why = f"worker failed twice on this chunk: {type(err).__name__}: {err}".strip()
                    rows = [(idx, {**inputs, "status": "failed", "diagnosis": why}) for idx, inputs, _ in chunk]
                # yielded outside the try: what the caller does with a row is no worker failure
                yield from rows
    except BaseException:
        runner.close(abort=True)
        raise
    runner.close(abort=False)


class _LocalRunner:
    """Worker processes on this machine. A worker that dies breaks its pool (every chunk in flight fails):
    the pool is replaced, and each retried chunk runs in a one-worker pool of its own."""

    def __init__(self, jobs: int, catalog_root: tuple[Path, bool] | None):
        self.slots = jobs
        self._root = catalog_root
        self._ex = self._pool(jobs)
        self._apart: dict = {}

    @staticmethod
    def _pool(n: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=n, initializer=_quiet_worker)

    def submit(self, chunk, path, opts, isolated: bool = False):
        args = (chunk, self._root, path, opts)
        if isolated:
            ex = self._pool(1)
            f = ex.submit(_run_chunk, args)
            self._apart[f] = ex
            return f
        try:
            return self._ex.submit(_run_chunk, args)
        except BrokenProcessPool:
            self._ex.shutdown(wait=False, cancel_futures=True)
            self._ex = self._pool(self.slots)
            return self._ex.submit(_run_chunk, args)

    @staticmethod
    def wait(futures):
        done, _ = wait(futures, return_when=FIRST_COMPLETED)
        return done

    def result(self, f):
        ex = self._apart.pop(f, None)
        try:
            return f.result()
        finally:
            if ex is not None:
                ex.shutdown(wait=False)

    def close(self, abort: bool) -> None:
        for ex in [self._ex, *self._apart.values()]:
            if abort:  # interrupted (Ctrl-C) or failed: stop the workers now instead of finishing their chunks
                for proc in list((getattr(ex, "_processes", None) or {}).values()):
                    proc.terminate()
            ex.shutdown(wait=not abort, cancel_futures=True)


def _quiet_worker() -> None:
    """Workers leave Ctrl-C to the parent, which keeps the finished points and stops them, and hold locks of
    their own (:func:`own_solver_lock`)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    own_solver_lock()


def own_solver_lock() -> None:
    """Give this process a lock of its own for Pyomo's solver-output capture.

    Pyomo guards ``capture_output`` (entered by every HiGHS solve) with a ``multiprocessing.Lock`` made at import,
    which forked workers share with their parent and with each other. A worker terminated while it holds it (the
    pool kills every worker when one dies) leaves it held for good, and every other worker then waits 200 s per
    solve before failing. Each worker solves one point at a time, so a per-process lock loses nothing."""
    import threading

    from pyomo.common import dependencies

    dependencies.capture_output_lock = threading.Lock()


def run_sweep(base: dict, path: Path, varies: list[Vary], catalog: Catalog, *, catalog_root: Path | None = None,
              jobs: int = 1, opts: PlanOptions | None = None, max_points: int = MAX_POINTS,
              progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Solve every point; one tidy row per point (inputs, status, costs, per-workload choices,
    timings), in the order of the Cartesian product."""
    total = check_sweep(base, path, varies, catalog, max_points)
    rows: dict[int, dict] = {}
    for idx, row in iter_sweep(base, path, varies, catalog, catalog_root=catalog_root, jobs=jobs, opts=opts):
        rows[idx] = row
        if progress:
            progress(len(rows), total)
    return sweep_frame(rows, varies)


def sweep_frame(rows: dict[int, dict], varies: list[Vary]) -> pd.DataFrame:
    """The rows in product order; points not solved (an interrupted sweep) appear with status ``not run``."""
    total = count_points(varies)
    if len(rows) == total:
        return pd.DataFrame([rows[i] for i in range(total)])
    out = []
    for i in range(total):
        if i in rows:
            out.append(rows[i])
            continue
        rest, inputs = i, {}
        for v in reversed(varies):
            rest, c = divmod(rest, len(v.values))
            inputs[v.path] = v.values[c]
        out.append({**{v.path: inputs[v.path] for v in varies}, "status": "not run", "diagnosis": "sweep interrupted"})
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------------------
# Tornado: +-20% on every numeric input


def tornado_inputs(base: dict, rs: ResolvedScenario, hardware_used: list[str]) -> list[tuple[str, float]]:
    """(path, base value) of the inputs a tornado moves: per workload traffic, prompt and output
    length and both SLOs; the price of every hardware the base plan buys."""
    out = []
    for w in rs.scenario.workloads:
        out += [
            (f"workloads.{w.name}.requests_per_s", w.requests_per_s),
            (f"workloads.{w.name}.input_tokens", w.input_tokens),
            (f"workloads.{w.name}.output_tokens", w.output_tokens),
            (f"workloads.{w.name}.slo.ttft_ms", w.slo.ttft_ms),
            (f"workloads.{w.name}.slo.tpot_ms", w.slo.tpot_ms),
        ]
    out += [(f"prices.{h}", rs.prices[h]) for h in hardware_used]
    return out


def tornado(base: dict, path: Path, catalog: Catalog, *, swing: float = 0.2, opts: PlanOptions | None = None,
            progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """$/M tokens at the base point and with each input moved by ``-swing`` and ``+swing``."""
    opts = opts or PlanOptions(analysis=False)
    _POOLS.clear()
    _GROUPS.clear()
    rs = validate_point(base, catalog, path, {})
    if opts.prefix_shares is None:  # demand moves by +-swing on the base point's model
        opts = dataclasses.replace(opts, prefix_shares=prefix_shares(rs.scenario.workloads, low=1 / (1 + swing),
                                                                     high=1 / max(1 - swing, 1e-9)))
    row = solve_point(rs, base, opts)
    if row["status"] not in ("optimal", "feasible"):
        raise InfeasibleError(f"{path}: the base scenario has no plan ({row['diagnosis']})")
    used = sorted({h for k, v in row.items() if k.endswith(".hardware") for h in str(v).split("+") if h})
    inputs = tornado_inputs(base, rs, used)
    out = []
    for n, (p, v0) in enumerate(inputs, start=1):
        res = {}
        for side, f in (("low", 1 - swing), ("high", 1 + swing)):
            doc = copy.deepcopy(base)
            val = v0 * f
            if p.endswith("_tokens"):
                val = max(1, round(val))
            set_path(doc, p, val)
            try:
                r = solve_point(validate_point(doc, catalog, path, {p: val}), doc, opts)
            except InputError as err:
                r = {"status": "error", "diagnosis": str(err)}
            res[side] = (val, r.get("usd_per_mtok", math.nan), r["status"])
        out.append({"input": p, "base_value": v0, "low_value": res["low"][0], "high_value": res["high"][0],
                    "usd_per_mtok_base": row["usd_per_mtok"], "usd_per_mtok_low": res["low"][1],
                    "usd_per_mtok_high": res["high"][1], "status_low": res["low"][2], "status_high": res["high"][2]})
        if progress:
            progress(n, len(inputs))
    df = pd.DataFrame(out)
    span = (df["usd_per_mtok_high"] - df["usd_per_mtok_low"]).abs()
    return df.assign(swing_usd_per_mtok=span).sort_values("swing_usd_per_mtok", ascending=False, na_position="last")
