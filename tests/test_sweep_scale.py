"""Sweeps at scale: points saved to Parquet parts as they finish, --resume solving only the missing points,
a Dask LocalCluster backend, and a worker that dies retried once and then reported, never dropped."""

from __future__ import annotations

import pandas as pd
import pytest
from test_robustness import cli, one_line_error, scenario

import planner.sweep as sw
from planner.sweep.store import PARTS

VALUES = "workloads.chat.requests_per_s=10,20,30,40,50,60"


def _interrupt_after(monkeypatch, n: int, seen: list[int]):
    real = sw.iter_sweep

    def run(*a, **k):
        for i, item in enumerate(real(*a, **k)):
            if i == n:
                raise KeyboardInterrupt
            seen.append(item[0])
            yield item

    monkeypatch.setattr(sw, "iter_sweep", run)


def _record(monkeypatch, seen: list[int]):
    real = sw.iter_sweep

    def run(*a, **k):
        for item in real(*a, **k):
            seen.append(item[0])
            yield item

    monkeypatch.setattr(sw, "iter_sweep", run)


@pytest.mark.parametrize("backend", ["local", "dask"])
def test_killed_sweep_resumes_only_the_missing_points(tmp_path, capsys, monkeypatch, backend):
    if backend == "dask":
        pytest.importorskip("distributed")
    s = scenario(tmp_path)
    out = tmp_path / "sw"
    # local: one process (forking this long-lived test process, which has run solver threads, can deadlock;
    # local worker processes are covered by the fresh-process test below); dask: a LocalCluster of 2 spawned workers
    jobs = "2" if backend == "dask" else "1"
    args = ["sweep", s, "--vary", VALUES, "--out", out, "--no-tornado", "--backend", backend, "--jobs", jobs]
    first: list[int] = []
    _interrupt_after(monkeypatch, 2, first)
    code, _, err = cli(capsys, *args)
    assert code == 1 and "--resume" in err, err
    kept = pd.concat([pd.read_parquet(f) for f in sorted((out / PARTS).glob("part-*.parquet"))])
    assert sorted(kept["point"]) == sorted(first) and len(first) == 2
    monkeypatch.undo()
    again: list[int] = []
    _record(monkeypatch, again)
    code, _, err = cli(capsys, *args, "--resume")
    assert code == 0, err
    assert sorted(again) == sorted(set(range(6)) - set(first))  # nothing solved twice
    assert "2 kept from" in err
    df = pd.read_csv(out / "sweep.csv")
    assert df["workloads.chat.requests_per_s"].tolist() == [10, 20, 30, 40, 50, 60]
    assert set(df["status"]) == {"optimal"}
    # the resumed sweep's answers are a fresh sweep's
    monkeypatch.undo()
    code, _, err = cli(capsys, "sweep", s, "--vary", VALUES, "--out", tmp_path / "fresh", "--no-tornado")
    fresh = pd.read_csv(tmp_path / "fresh" / "sweep.csv")
    assert df["usd_per_hour"].tolist() == pytest.approx(fresh["usd_per_hour"].tolist(), rel=1e-9)
    # a resume of a finished sweep solves nothing
    done: list[int] = []
    _record(monkeypatch, done)
    code, _, err = cli(capsys, *args, "--resume")
    assert code == 0 and done == [], err


def test_resume_refuses_another_scenario_or_values(tmp_path, capsys):
    s = scenario(tmp_path)
    out = tmp_path / "sw"
    code, _, err = cli(capsys, "sweep", s, "--vary", "workloads.chat.requests_per_s=10,20", "--out", out, "--no-tornado")
    assert code == 0, err
    code, _, err = cli(capsys, "sweep", s, "--vary", "workloads.chat.requests_per_s=10,30", "--out", out,
                       "--no-tornado", "--resume")
    assert code == 1
    one_line_error(err, "--resume", "other --vary values", "--force")
    other = scenario(tmp_path, workloads__0__input_tokens=999)
    code, _, err = cli(capsys, "sweep", other, "--vary", "workloads.chat.requests_per_s=10,20", "--out", out,
                       "--no-tornado", "--resume")
    assert code == 1
    one_line_error(err, "another scenario")
    manifest = out / PARTS / "sweep-manifest.json"
    manifest.write_text(manifest.read_text().replace('"planner": "', '"planner": "0.0.1-'))
    code, _, err = cli(capsys, "sweep", s, "--vary", "workloads.chat.requests_per_s=10,20", "--out", out,
                       "--no-tornado", "--resume")
    assert code == 1
    one_line_error(err, "another planner version")
    # without --resume or --force the parts are not thrown away
    code, _, err = cli(capsys, "sweep", s, "--vary", "workloads.chat.requests_per_s=10,20", "--out", tmp_path / "sw2",
                       "--no-tornado")
    (tmp_path / "sw2" / "sweep.csv").unlink()
    (tmp_path / "sw2" / "cost.png").unlink()
    (tmp_path / "sw2" / "pareto.png").unlink()
    code, _, err = cli(capsys, "sweep", s, "--vary", "workloads.chat.requests_per_s=10,20", "--out", tmp_path / "sw2",
                       "--no-tornado")
    assert code == 1
    one_line_error(err, "holds 2 points", "--resume", "--force")


def test_unreachable_scheduler_is_named(tmp_path, capsys):
    pytest.importorskip("distributed")
    code, _, err = cli(capsys, "sweep", scenario(tmp_path), "--vary", "workloads.chat.requests_per_s=10", "--out",
                       tmp_path / "sw", "--no-tornado", "--backend", "dask", "--scheduler", "tcp://127.0.0.1:9")
    assert code == 1
    one_line_error(err, "--scheduler tcp://127.0.0.1:9", "no Dask scheduler")
    # the failed start kept no points, so it does not block the next sweep into that folder
    code, _, err = cli(capsys, "sweep", scenario(tmp_path), "--vary", "workloads.chat.requests_per_s=10", "--out",
                       tmp_path / "sw", "--no-tornado")
    assert code == 0, err
    code, _, err = cli(capsys, "sweep", scenario(tmp_path), "--vary", "workloads.chat.requests_per_s=10", "--out",
                       tmp_path / "sw", "--backend", "ray")
    assert code == 1
    one_line_error(err, "--backend", "local or dask")


DEADLY = """
import os, sys
import planner.sweep.solving as sw
from planner.cli import main

real = sw.solve_one

def deadly(inputs, doc, catalog, path, opts):
    if inputs.get("workloads.chat.requests_per_s") == 30:
        os._exit(3)  # the worker process dies, as a crash or the OOM killer would end it
    return real(inputs, doc, catalog, path, opts)

sw.solve_one = deadly
main(sys.argv[1:])
"""


def test_a_worker_that_dies_is_retried_once_then_reported(tmp_path):
    """A point whose worker process dies is retried once in a worker of its own, then written as 'failed';
    every other point is solved. Runs in a fresh process (workers fork from it, so they run the patched
    function; forking this test process, which has run Dask's threads, could deadlock)."""
    import multiprocessing
    import subprocess
    import sys

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("worker processes run the patched function only when forked")
    out = tmp_path / "sw"
    p = subprocess.run([sys.executable, "-c", DEADLY, "sweep", str(scenario(tmp_path)), "--vary", VALUES, "--out",
                        str(out), "--no-tornado", "--jobs", "2"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    df = pd.read_csv(out / "sweep.csv")
    assert len(df) == 6
    bad = df[df["status"] == "failed"]
    assert bad["workloads.chat.requests_per_s"].tolist() == [30]
    assert "failed twice" in bad["diagnosis"].iloc[0]
    assert set(df.drop(bad.index)["status"]) == {"optimal"}
    assert "1 failed" in p.stderr
    # the failed point is not in the parts: --resume solves it again
    kept = pd.concat([pd.read_parquet(f) for f in (out / PARTS).glob("part-*.parquet")])
    assert 2 not in set(kept["point"]) and len(kept) == 5


HELD_LOCK = """
import sys
from pyomo.common import dependencies
import multiprocessing  # Pyomo upgrades its output-capture lock to a process-shared one on this import
from planner.cli import main

# as a worker the pool terminated in the middle of a solve would leave it (Pyomo before 6.10.1 has no such lock)
lock = getattr(dependencies, "capture_output_lock", None)
assert lock is None or lock.acquire(timeout=1)
main(sys.argv[1:])
"""


def test_workers_do_not_wait_on_a_lock_a_dead_worker_held(tmp_path):
    """Pyomo's solver-output lock is shared by forked processes; a worker killed while holding it must not
    stall the others (each would wait 200 s per solve): workers take a lock of their own."""
    import multiprocessing
    import subprocess
    import sys

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("Pyomo's output lock passes to forked workers only (this platform spawns them)")
    out = tmp_path / "sw"
    p = subprocess.run([sys.executable, "-c", HELD_LOCK, "sweep", str(scenario(tmp_path)), "--vary",
                        "workloads.chat.requests_per_s=10,20", "--out", str(out), "--no-tornado", "--jobs", "2"],
                       capture_output=True, text=True, timeout=150)
    assert p.returncode == 0, p.stderr
    assert set(pd.read_csv(out / "sweep.csv")["status"]) == {"optimal"}
