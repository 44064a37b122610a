"""What HiGHS spends on a fleet plan, and what its settings change (figures for issue notes, never a test).

    python bench/bench_highs.py [N] [--scenario FILE] [--demand-scale F] [--options JSON ...] [--best-of K]

Plans the N-workload fleet of ``bench_fleet.py`` (default 3; ``--demand-scale``: every rate times F), or the
scenario ``--scenario`` names, in this process, with the analysis, and writes
every MILP the planner hands HiGHS (MPS, the MIP start, the options the planner set) to a temporary folder.
Then:

- for the plan's own model, the size after presolve and four bounds: the LP relaxation, replica counts
  integral with units continuous, units integral with replica counts continuous, and the optimum;
- each ``--options`` set (a JSON object of HiGHS options, e.g. '{"threads": 0}' or
  '{"mip_allow_restart": false}'; '{}' is the planner's own settings, its thread count included) replayed
  over all the dumped models in a fresh process, from the same starts: total wall and CPU (per pass), each solve's wall
  and the objective it ended with (for a re-solve stopped at its time limit, the plan it had found); with
  ``--best-of K`` each model is run K times and its fastest wall kept (HiGHS is deterministic for given options:
  only the machine's noise differs). A model's options are read as HiGHS starts it (Pyomo sets them just before:
  read earlier, they were the previous solve's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PLANNER_OPTIONS = ("threads", "time_limit", "mip_rel_gap", "mip_allow_restart", "mip_heuristic_run_rins", "mip_heuristic_run_rens",
                   "mip_heuristic_run_root_reduced_cost", "mip_heuristic_run_zi_round", "mip_heuristic_run_shifting",
                   "mip_heuristic_run_feasibility_jump")


def dump(n: int, folder: Path, scenario_file: Path | None = None, demand_scale: float = 1.0) -> None:
    """Plan the fleet (or ``scenario_file``), writing each MILP HiGHS runs as ``mNN.mps`` with ``mNN.json``
    (options, start, which columns are purchase units)."""
    import numpy as np
    import pyomo.contrib.solver.solvers.highs as highs
    from bench_fleet import scenario

    from planner.catalog import load_catalog
    from planner.catalog.scenario import Scenario, load_scenario, resolve_scenario
    from planner.options import PlanOptions
    from planner.pipeline.plan import make_plan

    original = highs.Highs._solve
    count = [0]

    def solve(self):
        h = self._solver_model
        units = [col for vid, col in self._pyomo_var_to_solver_var_map.items()
                 if self._vars[vid][0].name.startswith("u[")]
        run = h.run

        def dump_then_run():
            # here, not before Pyomo's _solve: it sets this solve's options (a persistent instance otherwise
            # still holds the previous solve's)
            k = count[0]
            count[0] += 1
            h.writeModel(str(folder / f"m{k:02d}.mps"))
            sol = h.getSolution()
            meta = {"options": {o: _option(h, o) for o in PLANNER_OPTIONS}, "units": units,
                    "start": list(np.asarray(sol.col_value)) if sol.value_valid else None}
            (folder / f"m{k:02d}.json").write_text(json.dumps(meta))
            return run()

        h.run = dump_then_run
        try:
            return original(self)
        finally:
            del h.run

    highs.Highs._solve = solve
    try:
        if scenario_file is not None:
            rs = resolve_scenario(load_scenario(scenario_file), load_catalog(), scenario_file)
        else:
            rs = resolve_scenario(Scenario.model_validate(scenario(n, demand_scale)), load_catalog())
        make_plan(rs, PlanOptions(jobs=1))  # every MILP in this process, where the dump sees it
    finally:
        highs.Highs._solve = original


def _option(h, name: str):
    """An option's value (highspy returns ``(status, value)``)."""
    v = h.getOptionValue(name)
    return v[1] if isinstance(v, tuple) else v


def _highs(path: Path, meta: dict, options: dict):
    import highspy
    import numpy as np

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(path))
    for k, v in {**meta["options"], **options}.items():
        h.setOptionValue(k, v)
    if meta["start"] is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(np.asarray(meta["start"]))
        sol.value_valid = True
        h.setSolution(sol)
    return h


def bounds(folder: Path) -> None:
    import highspy

    path, meta = folder / "m00.mps", json.loads((folder / "m00.json").read_text())
    h = _highs(path, meta, {})
    h.presolve()
    lp = h.getPresolvedLp()
    print(f"plan's model after presolve: {lp.num_row_} rows x {lp.num_col_} columns")
    units = set(meta["units"])
    cont = highspy.HighsVarType.kContinuous
    for label, relax in (("LP relaxation", "all"), ("replicas integral, units continuous", "units"),
                         ("units integral, replicas continuous", "replicas"), ("optimum", "none")):
        h = _highs(path, {**meta, "start": None}, {})
        lp = h.getLp()
        for j, t in enumerate(lp.integrality_):
            if int(t) and (relax == "all" or (relax == "units") == (j in units)) and relax != "none":
                h.changeColIntegrality(j, cont)
        h.run()
        print(f"  {label:38} {h.getInfo().objective_function_value:12.2f}")


def replay(folder: Path, options: dict, best_of: int = 1) -> dict:
    import highspy

    walls, costs = [], []
    c0 = time.process_time()
    threads = None
    for path in sorted(folder.glob("m*.mps")):
        meta = json.loads(path.with_suffix(".json").read_text())
        want = {**meta["options"], **options}.get("threads", 0)
        if threads is not None and want != threads:
            highspy.Highs.resetGlobalScheduler(True)  # HiGHS's scheduler is process-wide (see planner.solve)
        threads = want
        best = float("inf")
        for _ in range(best_of):
            h = _highs(path, meta, options)
            t = time.perf_counter()
            h.run()
            best = min(best, time.perf_counter() - t)
        walls.append(best)
        costs.append(round(h.getInfo().objective_function_value, 2))
    return {"wall_s": sum(walls), "cpu_s": (time.process_time() - c0) / best_of, "each_s": [round(w, 2) for w in walls],
            "each_cost": costs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=3)
    ap.add_argument("--options", action="append", default=None, help="HiGHS options as JSON (repeatable)")
    ap.add_argument("--scenario", type=Path, help="a scenario file instead of the fleet")
    ap.add_argument("--demand-scale", type=float, default=1.0, help="the fleet's rates times this")
    ap.add_argument("--best-of", type=int, default=1, help="runs of each model, the fastest kept")
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.replay is not None:  # child process: one options set
        print(json.dumps(replay(a.replay, json.loads(a.options[0]), a.best_of)))
        return
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        dump(a.n, folder, a.scenario, a.demand_scale)
        what = a.scenario.name if a.scenario else f"{a.n} workloads x{a.demand_scale:g}"
        print(f"{what}: {len(list(folder.glob('m*.mps')))} MILPs")
        bounds(folder)
        for opt in a.options or ["{}"]:
            out = subprocess.run([sys.executable, __file__, "--replay", str(folder), "--options", opt,
                                  "--best-of", str(a.best_of)],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"  {opt:45} wall {r['wall_s']:6.2f} s  CPU {r['cpu_s']:6.2f} s  each {r['each_s']}")
            print(f"  {'':45} objective of each (what a re-solve cut short by its limit had found) {r['each_cost']}")


if __name__ == "__main__":
    main()
