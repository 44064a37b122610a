"""The public API (planner/__init__.py): what the command line calls, usable from Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import planner

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"


def test_import_is_light():
    """``import planner`` loads neither Pyomo nor pandas: the names come on first use."""
    code = "import sys, planner; print(any(m.split('.')[0] in ('pyomo', 'pandas', 'highspy') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_plan_from_a_path_is_the_committed_plan_and_its_frames_add_up():
    """``planner.plan`` on the bundled scenario gives the committed plan's objective; its DataFrame views agree with
    the plan: chips of the pools are the units' chips used, $/h of the units is the objective."""
    p = planner.plan(SCENARIO, planner.PlanOptions(analysis=False))
    committed = planner.Plan.model_validate_json((ROOT / "plans" / "llama-70b-chat" / "plan.json").read_text())
    assert p.objective.usd_per_hour == pytest.approx(committed.objective.usd_per_hour)
    pools, units, wl = p.pools_frame(), p.units_frame(), p.workloads_frame()
    assert len(pools) == len(p.pools) and pools["chips"].sum() == units["chips_used"].sum()
    assert units["usd_per_hour"].sum() == pytest.approx(p.objective.usd_per_hour)
    assert list(wl["name"]) == [w.name for w in p.workloads]
    assert p.periods_frame().empty


def test_load_scenario_names_the_file_of_bad_input(tmp_path):
    from planner.errors import InputError

    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.read_text().replace("requests_per_s: 50", "requests_per_s: -5"))
    with pytest.raises(InputError, match="bad.yaml.*workloads.0.requests_per_s"):
        planner.load_scenario(bad)


def test_run_sweep_rows_are_the_plans_of_their_points():
    """Each row of ``planner.run_sweep`` is the plan of its point: at the scenario's own demand, its objective."""
    df = planner.run_sweep(SCENARIO, ["workloads.chat.requests_per_s=25,50"])
    assert list(df["workloads.chat.requests_per_s"]) == [25, 50] and (df["status"] == "optimal").all()
    committed = planner.Plan.model_validate_json((ROOT / "plans" / "llama-70b-chat" / "plan.json").read_text())
    assert df["usd_per_hour"].iloc[1] == pytest.approx(committed.objective.usd_per_hour)
    assert df["usd_per_hour"].iloc[0] <= df["usd_per_hour"].iloc[1]
