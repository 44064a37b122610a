"""Solving a sweep's points: one candidate pool and model per group of points (mutable parameters re-solved in
place), in this process, in worker processes or on a Dask cluster, streamed as they finish.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pandas as pd

from planner.catalog.loader import Catalog
from planner.errors import InputError
from planner.options import PlanOptions
from planner.sweep.points import (
    MAX_POINTS,
    Vary,
    apply_values,
    count_points,
    iter_points,
    sweep_shares,
    validate_point,
)
from planner.sweep.solving import clear_groups, run_chunk, solve_one


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
            inputs, doc = apply_values(base, [(v, x)])
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
    clear_groups()
    points = (p for p in iter_points(base, varies) if p[0] not in skip)
    total = count_points(varies) - len(skip)
    if total <= 0:
        return
    jobs = max(1, min(jobs, total))
    if backend == "local" and jobs == 1:
        for idx, inputs, doc in points:
            yield idx, solve_one(inputs, doc, catalog, path, opts)
        return
    # contiguous chunks keep each group inside as few workers as possible; a few chunks per worker keep
    # the progress moving and bound the points held in memory
    size = max(1, min(64, math.ceil(total / (jobs * 4))))
    if backend == "dask":
        from planner.sweep.dask import DaskRunner

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
            f = ex.submit(run_chunk, args)
            self._apart[f] = ex
            return f
        try:
            return self._ex.submit(run_chunk, args)
        except BrokenProcessPool:
            self._ex.shutdown(wait=False, cancel_futures=True)
            self._ex = self._pool(self.slots)
            return self._ex.submit(run_chunk, args)

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

