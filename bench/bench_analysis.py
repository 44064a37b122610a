"""What each question of a plan's analysis costs (figures for issue notes, never a test).

    python bench/bench_analysis.py [SCENARIO.yaml | --fleet N] [--alone] [--time-limit S] [--master-min-columns C]

Plans the scenario (or the N-workload fleet of ``bench_fleet.py``) in this one process (``--jobs 1``, so that the
times add up) and prints, for each re-solve the analysis made, its wall time, what it relaxed, the fleet $/h it
found and whether that is proven; then the plan's candidates, solve and analysis times. A question asked together
with others of its workload (``planner.analysis.questions.together``) is one line; ``--alone`` asks every question alone (what the
analysis did before questions were asked together), for the comparison. ``--time-limit`` as ``planner plan``'s
(default 600 s here, so that the analysis is complete). ``--master-min-columns`` sets
``planner.solve.MASTER_MIN_COLUMNS`` for the comparison (0: the master on every model; 10**9: on none).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", nargs="?", type=Path)
    ap.add_argument("--fleet", type=int, help="the N-workload fleet of bench_fleet.py")
    ap.add_argument("--alone", action="store_true", help="ask every question alone")
    ap.add_argument("--time-limit", type=float, default=600.0)
    ap.add_argument("--master-min-columns", type=int, help="planner.solve.MASTER_MIN_COLUMNS for the comparison")
    a = ap.parse_args()
    if (a.scenario is None) == (a.fleet is None):
        ap.error("give a scenario file or --fleet N")
    if a.master_min_columns is not None:
        import planner.solve

        planner.solve.MASTER_MIN_COLUMNS = a.master_min_columns

    from planner.analysis import questions as planning
    from planner.catalog import load_catalog
    from planner.catalog.scenario import Scenario, load_scenario, resolve_scenario
    from planner.pipeline import PlanOptions, make_plan

    cat = load_catalog()
    if a.fleet is not None:
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_fleet import scenario

        rs = resolve_scenario(Scenario.model_validate(scenario(a.fleet)), cat)
    else:
        rs = resolve_scenario(load_scenario(a.scenario), cat, a.scenario)
    if a.alone:
        planning.together = list
    lines = []
    ask = planning.ask

    def timed(ctx, q, *rest):
        t = time.perf_counter()
        ans = ask(ctx, q, *rest)
        if not rest:  # a question of the analysis (a member asked inside a together-question is told by it)
            told = "; ".join(f"{m.kind} {m.which or ''}: {_told(b)}" for m, b in ans.parts) if ans.parts else _told(ans)
            lines.append(f"{time.perf_counter() - t:7.2f} s  {q.label[:70]:70}  {told}")
        return ans

    planning.ask = timed
    planned = make_plan(rs, PlanOptions(jobs=1, time_limit_s=a.time_limit))
    print("\n".join(lines))
    t = planned.timings
    print(f"candidates {t['candidates_s']:.2f} s, solve {t['solve_s']:.2f} s, analysis {t['analysis_s']:.2f} s "
          f"({len(lines)} asked{', each question alone' if a.alone else ''}), "
          f"${planned.plan.objective.usd_per_hour:,.2f}/h")


def _told(ans) -> str:
    if ans.runner_up is not None:
        ru = ans.runner_up
        return f"runner-up {'-' if ru.usd_per_hour is None else f'${ru.usd_per_hour:,.2f}/h'} ({ru.status})"
    return f"{'-' if ans.cost is None else f'${ans.cost:,.2f}/h'} {'proven' if ans.proven else 'not proven'}"


if __name__ == "__main__":
    main()
