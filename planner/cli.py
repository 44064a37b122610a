"""The ``planner`` command line: a thin layer over the library (no logic the library lacks).

Exit codes: 0 success, 1 bad input (one line naming the file or flag), 2 infeasible, 3 solver limit.
With ``--json`` stdout carries one JSON document and nothing else.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from planner.errors import InputError, PlannerError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Optimisation-based deployment planner for LLM serving.",
)
catalog_app = typer.Typer(no_args_is_help=True, help="List, show and validate the hardware and model catalogs.")
models_app = typer.Typer(no_args_is_help=True, help="Manage model entries.")
calibrate_app = typer.Typer(no_args_is_help=True, help="Fit efficiency factors and write the validation report.")
app.add_typer(catalog_app, name="catalog")
app.add_typer(models_app, name="models")
app.add_typer(calibrate_app, name="calibrate")

_state: dict = {"catalog": None, "alone": False}


def _catalog():
    from planner.catalog import load_catalog

    return load_catalog(_state["catalog"], alone=_state["alone"])


def _echo_json(obj) -> None:
    """One JSON document on stdout; a number that is not finite (a median over no rows) is written as null,
    never as the NaN or Infinity literals JSON does not have."""
    sys.stdout.write(json.dumps(_finite(obj), indent=2, default=_json_default, allow_nan=False) + "\n")


def _finite(obj):
    import math

    import numpy as np

    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    return obj


def _json_default(o):
    import datetime as dt

    import numpy as np

    if isinstance(o, (dt.date, dt.datetime)):
        return o.isoformat()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _check_engine(engine: str | None) -> str | None:
    """The catalog id of ``--engine`` (an id or alias), or None; exit 1 naming the flag when unknown."""
    if engine is None:
        return None
    return _flag("--engine", _catalog().get_engine, engine).id


def _flag(flag: str, lookup, ident: str):
    """A catalog lookup whose unknown-id error names the command-line flag."""
    try:
        return lookup(ident)
    except InputError as err:
        raise InputError(f"{flag}: {err}") from None


def _refuse_overwrite(path: Path, force: bool, flag: str = "--force") -> None:
    if path.exists() and not force:
        raise InputError(f"{path} exists; pass {flag} to overwrite it")


@app.callback()
def _root(
    catalog: Annotated[
        Path | None, typer.Option("--catalog", help="A folder of your own catalog files (hardware/, models/, engines/), "
                                  "layered over the bundled catalog: a file with a bundled id replaces that entry "
                                  "(default: $PLANNER_CATALOG_DIR, else the bundled catalog alone).")
    ] = None,
    catalog_alone: Annotated[
        bool, typer.Option("--catalog-alone", help="Use the --catalog folder's entries only, not the bundled ones.")
    ] = False,
) -> None:
    if catalog_alone and catalog is None and not os.environ.get("PLANNER_CATALOG_DIR"):
        raise InputError("--catalog-alone: give the folder with --catalog (or $PLANNER_CATALOG_DIR)")
    _state["catalog"] = catalog
    _state["alone"] = catalog_alone


# --------------------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------------------


@app.command()
def plan(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML (see catalogs/scenarios/).")],
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder for plan.md and plan.json (default: plans/<scenario>-<input hash>).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print plan.json on stdout as well.")] = False,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.1, help="Solver time limit, seconds.")] = 60.0,
    mip_gap: Annotated[float, typer.Option("--mip-gap", min=0.0, max=1.0, help="Relative MIP gap to stop at.")] = 1e-4,
    engine: Annotated[
        str | None, typer.Option("--engine", help="Run every pool on this engine (sglang, vllm, trtllm, atom): only hardware it runs on, its fitted factors.")
    ] = None,
    analysis: Annotated[
        bool, typer.Option("--analysis/--no-analysis", help="Price binding constraints and find the runner-up.")
    ] = True,
    jobs: Annotated[
        int | None, typer.Option("--jobs", min=1, help="Processes for the analysis's re-solves (default: one per core, up to 4, where the plan's solve takes 0.5 s or more; for 3+ workloads they start with the candidates, one evaluates part of them, and they re-solve from 0.2 s; 1: this process only).")
    ] = None,
    lp: Annotated[Path | None, typer.Option("--lp", help="Also write the MILP in LP format to this file (debugging).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing plan.")] = False,
    export: Annotated[
        list[str] | None, typer.Option("--export", help="Also export the plan for ops into OUT/export: sglang, vllm, trtllm, k8s or all (repeatable).")
    ] = None,
) -> None:
    """Plan the cheapest deployment that meets a scenario's traffic and SLOs; write plan.md and plan.json."""
    from planner.catalog.scenario import load_scenario, resolve_scenario, with_engine
    from planner.export.files import check_file, check_folder, owned_files
    from planner.export.plan import legacy_plan_files, plan_json, write_plan
    from planner.planning import PlanOptions, input_hash, make_plan

    engine = _check_engine(engine)
    rs = with_engine(resolve_scenario(load_scenario(scenario), _catalog(), scenario), engine)
    target = out or Path("plans") / f"{rs.scenario.name}-{input_hash(rs, engine or rs.scenario.engine)[:8]}"
    check_folder(target, option="--out")
    if not force:
        for name in sorted(owned_files(target, legacy_plan_files)) + ["plan.md", "plan.json"]:
            _refuse_overwrite(target / name, force)
    if lp is not None:
        check_file(lp, force=force, option="--lp")
    targets = None
    if export:
        from planner.export.bundle import parse_targets

        targets = parse_targets(export)
        check_folder(target / "export", option="--export (into --out/export)")
    opts = PlanOptions(time_limit_s=time_limit, mip_gap=mip_gap, engine=engine, analysis=analysis,
                       lp_path=None if lp is None else str(lp), jobs=jobs)
    with _stages() as say:
        res = make_plan(rs, opts, progress=say)
    md, js = write_plan(res.plan, target, force=force, files=res.files)
    if targets:
        from planner.export.bundle import export_plan

        export_plan(target, targets, target / "export", _catalog(), force=True)
    p = res.plan
    head = (f"${p.day.usd_per_day:,.2f}/day, ${p.day.usd_per_mtok:,.4f}/M tokens over the day (peak period "
            f"${p.objective.usd_per_hour:,.2f}/h, ${p.objective.usd_per_mtok:,.4f}/M tokens)" if p.day is not None else
            f"${p.objective.usd_per_hour:,.2f}/h, ${p.objective.usd_per_mtok:,.4f}/M tokens")
    typer.echo(
        f"{p.status}: {head}; "
        f"wrote {md} and {js} (candidates {res.timings['candidates_s']:.2f} s, solve {res.timings['solve_s']:.2f} s, "
        f"analysis {res.timings['analysis_s']:.2f} s)",
        err=True,
    )
    if as_json:
        sys.stdout.write(plan_json(p))


# --------------------------------------------------------------------------------------------------
# sweep and price-curve
# --------------------------------------------------------------------------------------------------


@contextmanager
def _stages():
    """On a terminal, a spinner on stderr naming the stage a plan is in (gone when it ends); elsewhere nothing
    (logs and pipes get the one summary line, as before)."""
    if not sys.stderr.isatty():
        yield lambda _msg: None
        return
    from rich.console import Console

    t0 = time.perf_counter()
    with Console(stderr=True).status("planning") as status:
        yield lambda msg: status.update(f"{msg} ({time.perf_counter() - t0:.0f} s)")


def _progress(label: str):
    """A rich progress bar on a terminal; without one, a plain line every 10 s (and at the end), so a log
    shows that a long run is alive."""
    if not sys.stderr.isatty():
        state = {"t": time.perf_counter(), "t0": time.perf_counter()}

        def line(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - state["t"] >= 10.0 or done == total:
                state["t"] = now
                sys.stderr.write(f"{label}: {done:,}/{total:,} points ({done / max(total, 1):.0%}), {now - state['t0']:.0f} s\n")
                sys.stderr.flush()

        return None, line
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    bar = Progress("[bold]" + label, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
    task = bar.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return bar, update


SWEEP_FILES = ("sweep.csv", "cost.png", "pareto.png", "tornado.csv", "tornado.png")


@app.command()
def sweep(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML.")],
    vary: Annotated[
        list[str], typer.Option("--vary", help="PATH=VALUES, e.g. workloads.chat.requests_per_s=100:1000:log:5 (repeatable).")
    ],
    out: Annotated[Path | None, typer.Option("--out", help="Folder for sweep.csv and plots (default sweeps/<scenario>).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Worker processes.")] = 1,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.1, help="Solver time limit per point, seconds.")] = 60.0,
    mip_gap: Annotated[float, typer.Option("--mip-gap", min=0.0, max=1.0)] = 1e-4,
    engine: Annotated[str | None, typer.Option("--engine", help="trtllm, sglang or vllm efficiency.")] = None,
    with_tornado: Annotated[
        bool, typer.Option("--tornado/--no-tornado", help="Also move every input +-20% around the scenario.")
    ] = True,
    max_points: Annotated[
        int, typer.Option("--max-points", min=1, help="Refuse sweeps with more points than this (each is a MILP solve).")
    ] = 10_000,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing sweep.")] = False,
    backend: Annotated[
        str, typer.Option("--backend", help="local (--jobs processes here) or dask (a Dask cluster).")
    ] = "local",
    scheduler: Annotated[
        str | None, typer.Option("--scheduler", help="Dask scheduler address (tcp://HOST:8786); default: a local cluster of --jobs workers.")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Solve only the points the folder's parts/ does not hold yet (same scenario, values, options).")
    ] = False,
) -> None:
    """Re-solve a scenario over the Cartesian product of --vary values; write sweep.csv and plots.

    Points are saved to OUT/parts/*.parquet as they finish: Ctrl-C (or a crash) keeps them, and --resume
    solves only the missing ones."""
    from planner.catalog.loader import read_yaml
    from planner.catalog.writer import atomic_write_text
    from planner.export import plots
    from planner.export.files import check_folder, owned_files, staged
    from planner.planning import PlanOptions
    from planner.sweep import check_sweep, iter_sweep, parse_vary, sweep_frame, tornado
    from planner.sweep_store import PartStore, sweep_identity

    engine = _check_engine(engine)
    if backend not in ("local", "dask"):
        raise InputError(f"--backend: '{backend}' is not a backend; use local or dask")
    if scheduler is not None and backend != "dask":
        raise InputError("--scheduler: a scheduler address needs --backend dask")
    base = read_yaml(scenario)
    if not isinstance(base, dict):
        raise InputError(f"{scenario}: expected a mapping of fields at top level")
    varies = [parse_vary(v) for v in vary]
    paths = [v.path for v in varies]
    if len(set(paths)) != len(paths):
        raise InputError("--vary: each PATH at most once")
    target = out or Path("sweeps") / str(base.get("name", scenario.stem))
    check_folder(target, option="--out")
    if not force and not resume:
        for name in sorted(owned_files(target, lambda f: {n for n in SWEEP_FILES if (f / n).is_file()})):
            _refuse_overwrite(target / name, force)
    cat = _catalog()
    total = check_sweep(base, scenario, varies, cat, max_points)
    opts = PlanOptions(time_limit_s=time_limit, mip_gap=mip_gap, engine=engine, analysis=False)
    store = PartStore(target, sweep_identity(base, varies, opts, cat), resume=resume, force=force)
    rows: dict[int, dict] = store.done() if resume else {}
    rows = {i: r for i, r in rows.items() if i < total}
    kept = len(rows)
    bar, update = _progress("sweep")
    t0 = time.perf_counter()
    interrupted = False
    buffer: list[tuple[int, dict]] = []
    flushed = time.perf_counter()
    if bar:
        bar.start()
    try:
        for idx, row in iter_sweep(base, scenario, varies, cat, catalog_root=_state["catalog"], jobs=jobs, opts=opts,
                                   skip=set(rows), backend=backend, scheduler=scheduler):
            rows[idx] = row
            if row.get("status") != "failed":  # a failed point is solved again by --resume
                buffer.append((idx, row))
            if len(buffer) >= 64 or time.perf_counter() - flushed > 5.0:
                store.write(buffer)
                buffer, flushed = [], time.perf_counter()
            update(len(rows), total)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        store.write(buffer)
        if bar:
            bar.stop()
    wall = time.perf_counter() - t0
    df = sweep_frame(rows, varies)
    written: list[Path] = []
    with staged(target, force=force or resume, unit=True, kind="sweep", written=written) as stage:
        atomic_write_text(stage / "sweep.csv", df.to_csv(index=False))
        if rows:
            plots.cost_vs_inputs(df, paths, stage / "cost.png")
            first = next((c for c in df.columns if c.endswith(".tokens_per_s_per_user")), None)
            if first is not None:
                ok = df[df["status"].isin(["optimal", "feasible"])]
                plots.pareto(ok[first].to_numpy(), ok["usd_per_mtok_output"].to_numpy(), stage / "pareto.png",
                             title=f"Cost against interactivity ({first.split('.')[0]})")
        if with_tornado and not interrupted:
            bar, update = _progress("tornado")
            if bar:
                bar.start()
            try:
                td = tornado(base, scenario, cat, opts=opts, progress=update)
            except PlannerError as err:
                typer.echo(f"tornado skipped: {err}", err=True)
                td = None
            except KeyboardInterrupt:
                typer.echo("tornado interrupted: left out", err=True)
                td = None
            finally:
                if bar:
                    bar.stop()
            if td is not None:
                atomic_write_text(stage / "tornado.csv", td.to_csv(index=False))
                plots.tornado_chart(td, stage / "tornado.png")
    ok = int(df["status"].isin(["optimal", "feasible"]).sum())
    if interrupted:
        typer.echo(f"interrupted: kept {len(rows):,} of {total:,} points in {target / 'sweep.csv'} and "
                   f"{store.folder} (the others read 'not run'); add --resume to the command to solve only those",
                   err=True)
        raise typer.Exit(1)
    solved = df[~df["status"].isin(["not run", "failed"])]
    failed = int((df["status"] == "failed").sum())
    again = f", {kept:,} kept from {store.folder}" if kept else ""
    lost = f"; {failed:,} failed (their workers died twice; --resume retries them)" if failed else ""
    typer.echo(
        f"{len(df)} points ({ok} with a plan{again}{lost}) in {wall:.1f} s with --backend {backend} --jobs {jobs}: "
        f"build {solved['build_s'].sum():.1f} s, update {solved['update_s'].sum():.2f} s, solve {solved['solve_s'].sum():.1f} s "
        f"summed over points; wrote {', '.join(str(p) for p in written)}",
        err=True,
    )


@app.command("price-curve")
def price_curve_cmd(
    model: Annotated[str, typer.Option("--model", help="Model id.")],
    hardware: Annotated[
        list[str] | None, typer.Option("--hardware", help="Hardware id (repeatable; default every priced entry).")
    ] = None,
    input_tokens: Annotated[int, typer.Option("--input-tokens", help="Prompt tokens per request.")] = 2000,
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Output tokens per request.")] = 500,
    ttft_ms: Annotated[float, typer.Option("--ttft-ms", min=1.0, help="TTFT every point must meet.")] = 5000.0,
    engine: Annotated[str | None, typer.Option("--engine", help="trtllm, sglang or vllm efficiency.")] = None,
    weights: Annotated[
        list[str] | None, typer.Option("--weights", help="Weight format a point may serve (repeatable: bf16, fp16, fp8, int8, fp4, int4); default the model's native format.")
    ] = None,
    kv: Annotated[
        list[str] | None, typer.Option("--kv", help="KV-cache format a point may use (repeatable); default fp8 and bf16.")
    ] = None,
    margin_quantile: Annotated[
        float | None, typer.Option("--margin-quantile", help="Price capacity at the model's measured error at this quantile (0-1), as a scenario's margin.quantile.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Cheapest $/M output tokens at each interactivity level, and what 1.5x-3x the speed costs."""
    from planner.perf.layout import describe_layout
    from planner.pricing import price_curve

    engine = _check_engine(engine)
    cat = _catalog()
    _flag("--model", cat.get_model, model)
    for h in hardware or []:
        _flag("--hardware", cat.get_hardware, h)
    pc = price_curve(cat, model, hardware, input_tokens=input_tokens, output_tokens=output_tokens,
                     ttft_ms=ttft_ms, engine=engine, weights=weights, kv=kv, margin_quantile=margin_quantile)
    if as_json:
        _echo_json(pc.to_json())
        return
    native = cat.get_model(model).weights_dtype
    typer.echo(f"{model}: {input_tokens} in / {output_tokens} out tokens, TTFT <= {ttft_ms:g} ms; weights "
               f"{', '.join(weights) if weights else native + ' (native; --weights for others)'}, KV "
               f"{', '.join(kv) if kv else 'fp8, bf16'}; {len(pc.points)} frontier points from {pc.rows_evaluated:,} evaluated")
    typer.echo(f"{'tok/s/user':>10}  {'$/M out':>9}  hardware        engine  weights/kv  layout                          batch")
    step = max(1, len(pc.points) // 15)
    for i, r in enumerate(pc.points.itertuples(index=False)):
        if i % step and i != len(pc.points) - 1:
            continue
        lay = describe_layout(r.tp, r.ep, r.pp, r.attn_dp, r.redundant) + (f" MTP{r.spec}" if r.spec else "") + (
            " TBO" if r.tbo else "")
        typer.echo(f"{r.tokens_per_s_per_user:10.1f}  {r.usd_per_mtok_output:9.4f}  {r.hardware:<15} {r.engine:<7} "
                   f"{r.weights_dtype + '/' + r.kv_dtype:<11} {lay:<31} {r.batch:>6}")
    typer.echo("speed tiers (x the cost-optimal interactivity -> x its price):")
    for t in pc.tiers:
        pm = t["price_multiple"]
        typer.echo(f"  {t['speed_multiple']:.1f}x -> " + (pm if isinstance(pm, str) else f"{pm:.2f}x ({t['hardware']})"))


@app.command()
def insights(
    model: Annotated[list[str], typer.Option("--model", help="Model id (repeatable, paired with --hardware).")],
    hardware: Annotated[list[str], typer.Option("--hardware", help="Hardware id (repeatable, paired with --model).")],
    out: Annotated[Path, typer.Option("--out", help="Folder for insights.md and insights/*.png.")] = Path("insights"),
    context: Annotated[int, typer.Option("--context", min=1, help="Mean context length, tokens.")] = 2048,
    engine: Annotated[str | None, typer.Option("--engine", help="trtllm, sglang or vllm efficiency.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing insights.md.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The headline figures as JSON on stdout.")] = False,
) -> None:
    """How batch, context, sparsity, pipelining and scale-up domains set cost and latency, computed."""
    from planner.export.files import check_file, check_folder, staged
    from planner.export.insights import command, write
    from planner.insights import compute

    if len(model) != len(hardware):
        raise InputError("--model and --hardware: give them in pairs (one --hardware per --model)")
    engine = _check_engine(engine)
    check_folder(out, option="--out")
    check_file(out / "insights.md", force=force, option="--out")
    cat = _catalog()
    for m, h in zip(model, hardware, strict=True):
        _flag("--model", cat.get_model, m)
        _flag("--hardware", cat.get_hardware, h)
    items = [compute(cat, m, h, context=context, engine=engine) for m, h in zip(model, hardware, strict=True)]
    with staged(out, force=force, unit=False) as stage:  # every file (plots included) refused without --force
        write(items, stage, command(list(zip(model, hardware, strict=True)), out, context))
    md = out / "insights.md"
    if as_json:
        js = [i.to_json() for i in items]
        _echo_json(js[0] if len(js) == 1 else js)
    else:
        typer.echo(f"wrote {md}", err=True)


@app.command("export")
def export_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan folder (with plan.json).")],
    target: Annotated[list[str], typer.Option("--target", help="sglang, vllm, trtllm, k8s or all (repeatable, or comma-separated).")],
    out: Annotated[Path | None, typer.Option("--out", help="Folder to write (default PLAN_DIR/export).")] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="Kubernetes namespace of the manifests.")] = "default",
    gateway: Annotated[str, typer.Option("--gateway", help="Gateway (Gateway API) the workloads' HTTPRoutes attach to.")] = "inference-gateway",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing export.")] = False,
) -> None:
    """Hand a plan to ops: engine launch scripts, expert maps per engine, Kubernetes manifests, routes weighted as
    the plan routes traffic, autoscaling, SLO alerts and a runbook."""
    import re

    from planner.export.bundle import export_plan, parse_targets
    from planner.export.files import check_folder, owned_files

    targets = parse_targets(target)
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", namespace) or len(namespace) > 63:
        raise InputError(f"--namespace '{namespace}': a Kubernetes namespace is lowercase letters, digits and '-'")
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", gateway) or len(gateway) > 253:
        raise InputError(f"--gateway '{gateway}': a Kubernetes object name is lowercase letters, digits, '-' and '.'")
    dest = out or plan_dir / "export"
    check_folder(dest, option="--out")
    if not force and owned_files(dest):
        raise InputError(f"{dest} holds an export; pass --force to replace it, or choose another --out")
    doc = export_plan(plan_dir, targets, dest, _catalog(), force=force, namespace=namespace, gateway=gateway)
    typer.echo(f"wrote {len(doc['files']) + 1} files under {dest} ({', '.join(targets)})"
               + (f"; not exported: {len(doc['skipped'])} (see export.json)" if doc["skipped"] else ""), err=True)


@app.command("schema")
def schema_cmd(
    what: Annotated[str, typer.Argument(help="plan: the JSON Schema of plan.json.")],
) -> None:
    """Print the JSON Schema of a file the planner writes (the contract programs read)."""
    from planner.results import Plan

    if what != "plan":
        raise InputError(f"schema: unknown document '{what}'; use plan")
    _echo_json(Plan.model_json_schema())


# --------------------------------------------------------------------------------------------------
# experts
# --------------------------------------------------------------------------------------------------


@app.command()
def experts(
    model: Annotated[str, typer.Option("--model", help="MoE model id.")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs of the expert-parallel group.")],
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1, help="GPUs per node (node-spread term).")] = 8,
    redundant: Annotated[str, typer.Option("--redundant", help="Redundant expert slots R, or 'auto'.")] = "auto",
    load: Annotated[Path | None, typer.Option("--load", help="CSV expert,load or layer,expert,load.")] = None,
    skew: Annotated[str, typer.Option("--skew", help="Synthetic power-law load without --load: zipf:S.")] = "zipf:1.0",
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1, help="Seed of the synthetic load and the search.")] = 0,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.5, help="Seconds for the whole placement.")] = 10.0,
    hardware: Annotated[
        str | None, typer.Option("--hardware", help="GPU id: checks memory and bounds --redundant auto.")
    ] = None,
    merge_layers: Annotated[
        bool, typer.Option("--one-placement", help="With a multi-layer CSV: one placement for all layers.")
    ] = False,
    map_file: Annotated[Path | None, typer.Option("--map", help="Write the placement map (JSON) here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --map file.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Choose redundant experts and place them on GPUs (MILP), next to the greedy EPLB baseline."""
    from planner.catalog.expert_loads import read_expert_loads
    from planner.catalog.writer import atomic_write_text
    from planner.experts import check_memory, check_shape, choose_redundant, place_layers, placement_map
    from planner.export.files import check_file
    from planner.perf.experts import parse_skew, zipf_loads
    from planner.perf.params import model_stats

    cat = _catalog()
    m = _flag("--model", cat.get_model, model)
    if not m.is_moe:
        raise InputError(f"--model {m.id}: a dense model has no experts to place")
    hw = _flag("--hardware", cat.get_hardware, hardware) if hardware else None
    n_exp = m.architecture.moe.experts
    if map_file is not None:
        check_file(map_file, force=force, option="--map")
    if load is not None:
        loads = read_expert_loads(load, n_exp)
    else:
        try:
            s = parse_skew(skew)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        loads = {0: zipf_loads(n_exp, s, seed)}
    if gpus < 1:
        raise InputError("--gpus: must be at least 1")
    common = dict(gpus_per_node=gpus_per_node, time_limit_s=time_limit, seed=seed, merge=merge_layers)
    curve = rule = None
    if redundant.strip().lower() == "auto":
        choice = choose_redundant(loads, gpus, model=m, hw=hw, **common)
        lp, curve, rule = choice.chosen, choice.curve, choice.rule
    else:
        try:
            r = int(redundant)
        except ValueError:
            raise InputError(f"--redundant: expected a whole number or 'auto', got '{redundant}'") from None
        check_shape(n_exp, gpus, r)
        if hw is not None:
            check_memory(m, hw, gpus, r)
        lp = place_layers(loads, gpus, r, **common)
    out = {"model": m.id, "load": str(load) if load else f"zipf:{parse_skew(skew)} seed {seed}", **lp.to_json()}
    if curve is not None:
        out["redundancy"] = {"rule": rule, "curve": curve}
    if map_file is not None:
        doc = placement_map(lp, model_id=m.id, moe_layers=model_stats(m).moe_layers)
        atomic_write_text(map_file, json.dumps(doc) + "\n")
        out["map_file"] = str(map_file)
    if as_json:
        _echo_json(out)
        return
    sv = out["solver"]
    typer.echo(
        f"{m.id}: {n_exp} experts + {out['redundant_experts']} redundant on {gpus} GPUs "
        f"({out['slots_per_gpu']} slots each; {out['layers_placed']})"
    )
    typer.echo(f"  imbalance (max / mean GPU load), even split among copies:  MILP {out['imbalance']:.4f}   "
               f"greedy EPLB {out['greedy_imbalance']:.4f}")
    def _bal(x: float | None) -> str:
        return "n/a (no time left in --time-limit)" if x is None else f"{x:.4f}"

    typer.echo(f"  same placements under a balancing router:               MILP {_bal(out['imbalance_balanced'])}   "
               f"greedy EPLB {_bal(out['greedy_imbalance_balanced'])}")
    typer.echo(f"  solver: {sv['status']}, gap {sv['mip_gap']:.4%}, {sv['wall_s']:.1f} s")
    if curve is not None:
        typer.echo(f"  --redundant auto: {rule}")
        for c in curve:
            extra = "" if c["extra_bytes_per_gpu"] is None else f", +{c['extra_bytes_per_gpu'] / 1e9:.2f} GB/GPU"
            typer.echo(f"    R={c['redundant_experts']:>4}: imbalance {c['imbalance']:.4f} (greedy {c['greedy_imbalance']:.4f}){extra}")
    if map_file is not None:
        typer.echo(f"  wrote {map_file}")


# --------------------------------------------------------------------------------------------------
# roofline
# --------------------------------------------------------------------------------------------------

DTYPE_HELP = "bf16, fp16, fp8, int8, fp4 or int4"


@app.command()
def roofline(
    model: Annotated[str, typer.Option("--model", help="Model id (or a Hugging Face id it lists).")],
    hardware: Annotated[str, typer.Option("--hardware", help="Hardware id (or an alias).")],
    batch: Annotated[float, typer.Option("--batch", help="Decode: sequences in flight per replica (all micro-batches). Prefill: prompts in one pass.")],
    context: Annotated[float, typer.Option("--context", help="Decode: mean context in tokens. Prefill: new prompt tokens per prompt.")],
    phase: Annotated[str, typer.Option("--phase", help="decode (one decode step) or prefill (one prefill pass).")] = "decode",
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree (per attention rank).")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 1,
    attn_dp: Annotated[int, typer.Option("--attn-dp", "--dp", help="Attention data-parallel ranks (SGLang DP attention, TRT-LLM ADP): attention replicated per rank, experts shared by all.")] = 1,
    redundant: Annotated[int, typer.Option("--redundant-experts", help="Redundant expert slots; EP must divide experts + redundant.")] = 0,
    tbo: Annotated[bool, typer.Option("--tbo", help="Two micro-batch overlap (decode).")] = False,
    prefix: Annotated[float, typer.Option("--prefix", help="Prefill: cached prefix tokens per prompt.")] = 0.0,
    weights: Annotated[str | None, typer.Option("--weights", help=f"Weight format ({DTYPE_HELP}); default native.")] = None,
    kv: Annotated[str, typer.Option("--kv", help=f"KV-cache format ({DTYPE_HELP}).")] = "bf16",
    ideal: Annotated[bool, typer.Option("--ideal", help="Efficiency 1 and no overheads.")] = False,
    engine: Annotated[str | None, typer.Option("--engine", help="Serving engine whose fitted factors to use.")] = None,
    spec_tokens: Annotated[
        int, typer.Option("--spec-tokens", help="Speculative decoding: draft tokens per step (MTP/EAGLE; 0: off).")
    ] = 0,
    spec_accept: Annotated[
        float | None, typer.Option("--spec-accept", help="Probability each draft is accepted (0-1); default the model's catalog acceptance.")
    ] = None,
    allow_misfit: Annotated[
        bool, typer.Option("--allow-misfit", help="Show the roofline of a layout that does not fit in memory (no price; exit 0).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """Roofline of one decode step or one prefill pass: compute, memory and communication time, cost and memory fit.
    A layout that does not fit is an error (exit 1) unless --allow-misfit, and is never priced."""
    import math

    from planner.catalog.schemas import IDEAL
    from planner.perf.layout import Layout, check_layout
    from planner.perf.report import prefill_roofline, require_fit
    from planner.perf.report import roofline as run
    from planner.perf.roofline import MAX_SPEC_TOKENS, Setup
    from planner.units import DTYPES

    cat = _catalog()
    m = _flag("--model", cat.get_model, model)
    hw = _flag("--hardware", cat.get_hardware, hardware)
    if phase not in ("decode", "prefill"):
        raise InputError(f"--phase '{phase}' is not known; use decode or prefill")
    for flag, v in (("--batch", batch), ("--context", context), ("--prefix", prefix)):
        if not math.isfinite(v):
            raise InputError(f"{flag} must be a finite number")
    if batch <= 0:
        raise InputError("--batch must be > 0 (sequences in flight per replica, or prompts per prefill pass)")
    if batch > 1e7 or context > 1e8 or prefix > 1e8:
        raise InputError("--batch (at most 1e7), --context and --prefix (at most 1e8 tokens) are out of range")
    if context < 0 or (phase == "prefill" and context < 1):
        raise InputError("--context must be >= 0 tokens (>= 1 new token for --phase prefill)")
    if prefix < 0:
        raise InputError("--prefix must be >= 0 tokens")
    if weights is not None and weights != "native" and weights not in DTYPES:
        raise InputError(f"--weights '{weights}' is not a known format; use native or one of {', '.join(DTYPES)}")
    if kv not in DTYPES:
        raise InputError(f"--kv '{kv}' is not a known format; use one of {', '.join(DTYPES)}")
    eng = None
    if engine is not None:
        eng = _flag("--engine", cat.get_engine, engine)
        if not eng.runs_on(hw):
            raise InputError(f"--engine {eng.id} does not run on {hw.id} ({hw.vendor}); it runs on {', '.join(eng.vendors)} hardware")
    if not 0 <= spec_tokens <= MAX_SPEC_TOKENS:
        raise InputError(f"--spec-tokens {spec_tokens} is out of range; use 0 (off) to {MAX_SPEC_TOKENS} draft tokens per step")
    if spec_accept is not None and not (math.isfinite(spec_accept) and 0.0 <= spec_accept <= 1.0):
        raise InputError(f"--spec-accept {spec_accept} is not a probability; use a value from 0 to 1")
    layout = Layout(tp, ep, pp, attn_dp, redundant)
    check_layout(m, layout)
    eff = IDEAL if ideal else hw.efficiency.for_engine(eng.id if eng else None)
    setup = Setup.make(m, hw, weights=weights, kv=kv, eff=eff, spec_tokens=spec_tokens, spec_accept=spec_accept,
                       tbo=1.0 if tbo else 0.0, engine=eng.id if eng else None)
    mode = "ideal" if ideal else "calibrated"
    from planner.export.text import prefill_text, roofline_text

    if phase == "prefill":
        pres = prefill_roofline(setup, layout, batch, context, prefix=prefix, mode=mode, engine=eng.id if eng else None)
        if not allow_misfit:
            require_fit(pres, layout, hw.hbm_bytes)
        if as_json:
            _echo_json(pres.to_dict())
        else:
            typer.echo(prefill_text(pres))
        return
    res = run(setup, layout, batch, context, mode=mode, engine=eng.id if eng else None)
    if not allow_misfit:
        require_fit(res, layout, hw.hbm_bytes)
    if as_json:
        _echo_json(res.to_dict())
        return
    typer.echo(roofline_text(res))


# --------------------------------------------------------------------------------------------------
# catalog
# --------------------------------------------------------------------------------------------------


@catalog_app.command("list")
def catalog_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every model and hardware entry with its key figures."""
    from planner.export.catalog import catalog_summary

    data = catalog_summary(_catalog())
    if as_json:
        _echo_json(data)
        return
    from planner.export.text import catalog_text

    typer.echo(catalog_text(data))


@catalog_app.command("show")
def catalog_show(ident: Annotated[str, typer.Argument(help="Model or hardware id (or alias).")],
                 as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """One entry, with the figures derived from it."""
    from planner.export.catalog import entry_detail

    cat = _catalog()
    data = entry_detail(cat, ident)
    if as_json:
        _echo_json(data)
        return
    from planner.catalog.writer import dump_yaml

    typer.echo(dump_yaml(data).rstrip())


@catalog_app.command("validate")
def catalog_validate() -> None:
    """Load every catalog file through the strict schemas and cross-check ids, aliases and sources."""
    from planner.export.catalog import validate_catalog

    cat = _catalog()
    notes = validate_catalog(cat)
    for n in notes:
        typer.echo(f"note: {n}", err=True)
    where = f"{cat.root} over the bundled catalog" if cat.layered else str(cat.root)
    typer.echo(f"ok: {len(cat.hardware)} hardware and {len(cat.models)} model entries in {where}")


# --------------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------------


@models_app.command("import")
def models_import(
    config: Annotated[Path, typer.Argument(help="A Hugging Face config.json.")],
    ident: Annotated[str, typer.Option("--id", help="Catalog id for the model (lowercase kebab-case).")],
    hf_id: Annotated[str | None, typer.Option("--hf-id", help="Hugging Face id (default: from the file name org--name.json).")] = None,
    name: Annotated[str | None, typer.Option("--name")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="File to write ('-' for stdout); default catalogs/models/ID.yaml.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing entry.")] = False,
) -> None:
    """Write a model entry from a Hugging Face config.json (dense, GQA, MoE, MLA, sliding window)."""
    import re

    from planner.catalog.hf_import import import_config
    from planner.catalog.writer import atomic_write_text, dump_yaml
    from planner.export.files import check_file

    if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", ident):
        raise InputError(f"--id '{ident}' must be lowercase kebab-case (letters, digits, '.', '-')")
    spec = import_config(config, model_id=ident, hf_id=hf_id, name=name)
    text = dump_yaml(spec.model_dump(mode="json", exclude_none=True))
    if out is not None and str(out) == "-":
        sys.stdout.write(text)
        return
    target = out or (_catalog_root() / "models" / f"{ident}.yaml")
    check_file(target, force=force, option="--out")
    atomic_write_text(target, text)
    typer.echo(f"wrote {target}", err=True)


def _catalog_root() -> Path:
    """Where ``models import`` writes without ``--out``: the user's catalog folder, or a checkout's catalogs/
    (never into an installed package)."""
    from planner.catalog.loader import bundled_catalog_dir, default_catalog_dir

    root = _state["catalog"] or default_catalog_dir()
    if root is not None:
        return Path(root)
    bundled = bundled_catalog_dir()
    if bundled.name == "_catalogs":
        raise InputError("no catalog folder of your own to write into: pass --out FILE or --catalog DIR")
    return bundled


# --------------------------------------------------------------------------------------------------
# predict / validate / calibrate
# --------------------------------------------------------------------------------------------------


FORMAT_HELP = "Measured-data format: silicon (CSV) or inferencex (JSON); detected when not given."


@app.command()
def predict(
    data: Annotated[list[Path], typer.Option("--data", help="Measured configurations: a silicon_calibration.csv-style CSV or an InferenceX JSON run file (one per run).")],
    out: Annotated[Path, typer.Option("--out", help="CSV to write with the predictions.")],
    fmt: Annotated[str | None, typer.Option("--format", help=FORMAT_HELP)] = None,
    force: Annotated[bool, typer.Option("--force")] = False,
) -> None:
    """Predict TTFT, TPOT and output throughput per GPU of measured configurations from physics and fitted factors."""
    from planner.calib.data import load_measured
    from planner.calib.predict import predict_measured
    from planner.catalog.writer import atomic_write_text
    from planner.export.files import check_file

    if len(data) != 1:
        # rows of the two formats have different columns: one output file per input file
        raise InputError(f"--data was given {len(data)} times; predict writes one file's rows to --out: run it once "
                         "per file (validate and calibrate take several)")
    check_file(out, force=force, option="--out")
    cat = _catalog()
    meas = load_measured(data[0], cat, fmt=fmt)
    res = predict_measured(meas, cat)
    atomic_write_text(out, res.to_csv(index=False))
    n_ok = int(res["predicted_tpot_ms"].notna().sum())
    typer.echo(f"wrote {out}: {n_ok} of {len(res)} {'runs' if meas.fmt == 'inferencex' else 'rows'} predicted", err=True)


@app.command()
def validate(
    data: Annotated[list[Path], typer.Option("--data", help="Measured rows (either format; repeatable).")],
    fmt: Annotated[str | None, typer.Option("--format", help=FORMAT_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Median and p90 absolute percentage error of TPOT, TTFT and output throughput per GPU: overall, per
    system, engine, serving mode, speculative decoding and concurrency band."""
    from planner.calib.data import load_measured
    from planner.calib.metrics import evaluation_frame, format_table, frame_summary
    from planner.calib.predict import notes, predict_normalised

    cat = _catalog()
    frames = {}
    for path in data:
        meas = load_measured(path, cat, fmt=fmt, measured=True)
        if meas.norm["m_tpot"].notna().sum() == 0:
            raise InputError(f"{path}: no measured rows (validation needs measured TTFT and TPOT)")
        pred = predict_normalised(meas.norm, cat)
        if pred["predicted_tpot_ms"].notna().sum() == 0:
            why = meas.norm["reason"][meas.norm["reason"] != ""]
            top = f" (most common reason: {why.value_counts().index[0]})" if len(why) else ""
            raise InputError(f"{path}: none of its {len(meas.norm)} rows can be predicted{top}")
        frames[str(path)] = evaluation_frame(meas, pred, notes(meas.norm, pred, cat, meas.fmt))
    summaries = {k: frame_summary(f) for k, f in frames.items()}
    if as_json:
        _echo_json(next(iter(summaries.values())) if len(summaries) == 1 else {"files": summaries})
        return
    for path, sm in summaries.items():
        typer.echo(f"{path}\n\nOverall\n" + format_table([sm["overall"]], []))
        for key, cols, title in (("by_system", ["system"], "Per system"), ("by_engine", ["engine"], "Per engine"),
                                 ("by_mode", ["mode"], "Per serving mode"), ("by_spec", ["spec"], "Speculative decoding"),
                                 ("by_concurrency", ["conc_band"], "Per concurrency band")):
            typer.echo(f"\n{title}\n" + format_table(sm[key], cols))
        typer.echo("")


@calibrate_app.command("fit")
def calibrate_fit(
    data: Annotated[list[Path], typer.Option("--data", help="Measured rows to fit on (either format; repeatable).")],
    fmt: Annotated[str | None, typer.Option("--format", help=FORMAT_HELP)] = None,
    write: Annotated[bool, typer.Option("--write", help="Rewrite the efficiency blocks of catalogs/hardware/*.yaml.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Fit per-hardware and per-engine efficiency factors (robust least squares on log errors)."""
    from planner.calib.data import load_measured
    from planner.calib.fit import efficiency_blocks, fit
    from planner.calib.margins import measured_quantiles, with_quantiles
    from planner.catalog.loader import clear_cache
    from planner.catalog.writer import replace_efficiency_block

    cat = _catalog()
    sets = [load_measured(p, cat, fmt=fmt, measured=True) for p in data]
    res = fit(sets, cat)
    blocks = efficiency_blocks(res, cat, " and ".join(Path(p).name for p in data))
    # the error the new factors leave on the same rows, per class, for scenarios' margin.quantile
    blocks = with_quantiles(blocks, measured_quantiles(sets, cat, lambda h, e: blocks[h].for_engine(e)), cat)
    if write:
        for hid, eff in blocks.items():
            replace_efficiency_block(cat.files[hid], eff)
        clear_cache()
        typer.echo(f"wrote efficiency blocks of {len(blocks)} hardware files", err=True)
    payload = {hid: b.model_dump(mode="json") for hid, b in blocks.items()}
    if as_json:
        _echo_json(payload)
    else:
        for hid, b in blocks.items():
            typer.echo(f"{hid}: {b.fitted_rows} rows; default {b.default.model_dump()}")


@calibrate_app.command("kernels")
def calibrate_kernels(
    data: Annotated[Path, typer.Option("--data", help="Kernel measurements: a folder SYSTEM/FAMILY/ENGINE/FILE.parquet (../shared/calibration/kernels).")],
    system: Annotated[list[str] | None, typer.Option("--system", help="Fit only this system folder (repeatable).")] = None,
    family: Annotated[list[str] | None, typer.Option("--family", help="Fit only this family: gemm, moe, attn_decode, mla_decode, collective, deepep (repeatable).")] = None,
    write: Annotated[bool, typer.Option("--write", help="Store the curves in the efficiency blocks of the catalog's hardware files.")] = False,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Processes, one system each.")] = 2,
    report: Annotated[Path | None, typer.Option("--report", help="Write the fit errors per family and system as Markdown, with a residual plot beside it (docs/kernels.md).")] = None,
    compose: Annotated[bool | None, typer.Option("--compose/--no-compose", help="With --write: compose the calibrated step from these curves (refit the end-to-end factors after: calibrate fit --write). Default: as the catalog has it (off for a new block).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --report and its plot.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Fit each term of the step (GEMM, fused MoE, decode attention and MLA, collectives, DeepEP) on measured
    kernel latencies, per system, engine and format; scored on shapes held out of the fit."""
    from planner.calib.kernels import (
        curve_table,
        family_table,
        fit_kernels,
        kernel_block,
        plot_residuals,
        report_markdown,
    )
    from planner.catalog.loader import clear_cache
    from planner.catalog.writer import atomic_write_text, atomic_write_with, replace_efficiency_block
    from planner.export.files import check_file
    from planner.perf.kernels import PARAMS

    bad = [f for f in (family or []) if f not in PARAMS]
    if bad:
        raise InputError(f"--family {bad[0]}: unknown (known: {', '.join(PARAMS)})")
    if compose is not None and not write:
        raise InputError("--compose/--no-compose sets the catalog's kernel blocks: give it with --write")
    plot = report.with_name(report.stem + "-residuals.png") if report else None
    if report:
        check_file(report, force=force, option="--report")
        check_file(plot, force=force, option="--report (its plot)")
    cat = _catalog()
    reports = fit_kernels(data, cat, systems=system or None, families=set(family) if family else None, jobs=jobs)
    source = (f"fitted by `planner calibrate kernels --data {data.name}` on measured kernel latencies "
              "(ai-dynamo/aiconfigurator collectors, Apache-2.0; see its manifest.json)")
    if write:
        n = 0
        for r in reports:
            if not r.hardware or not r.curves:
                continue
            hw = cat.hardware[r.hardware]
            block = kernel_block(r, source)
            old = hw.efficiency.kernels
            on = compose if compose is not None else (old.compose if old is not None else False)
            block = block.model_copy(update={"compose": on})
            if old is not None and (family or system):
                # A partial refit (some families or systems) keeps the other curves of the block.
                block = block.model_copy(update={"curves": {**old.curves, **block.curves},
                                                 "notes": list(dict.fromkeys(old.notes + block.notes))})
            replace_efficiency_block(cat.files[r.hardware], hw.efficiency.model_copy(update={"kernels": block}))
            n += 1
        clear_cache()
        typer.echo(f"wrote kernel curves into {n} hardware files", err=True)
    fam = family_table(reports)
    if report:
        atomic_write_with(plot, lambda tmp: plot_residuals(reports, Path(tmp)))
        cmd = f"planner calibrate kernels --data {data}{' --write' if write else ''} --report {report}"
        atomic_write_text(report, report_markdown(reports, cmd, plot.name))
        typer.echo(f"wrote {report} and {plot}", err=True)
    if as_json:
        _echo_json({"families": fam.to_dict(orient="records"), "curves": curve_table(reports).to_dict(orient="records"),
                    "notes": {r.system: r.notes for r in reports if r.notes}})
        return
    typer.echo(fam.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    for r in reports:
        for note in r.notes:
            typer.echo(f"note: {note}", err=True)


@calibrate_app.command("margins")
def calibrate_margins(
    data: Annotated[list[Path], typer.Option("--data", help="Measured rows (either format; repeatable).")],
    fmt: Annotated[str | None, typer.Option("--format", help=FORMAT_HELP)] = None,
    write: Annotated[bool, typer.Option("--write", help="Store them in the efficiency blocks of catalogs/hardware/*.yaml.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Quantiles of measured / predicted TPOT per hardware, engine and serving mode with the catalog's current
    factors (what `calibrate fit` stores beside the factors; the factors themselves are left as they are)."""
    from planner.calib.data import load_measured
    from planner.calib.margins import measured_quantiles, with_quantiles
    from planner.catalog.loader import clear_cache
    from planner.catalog.writer import replace_efficiency_block

    cat = _catalog()
    sets = [load_measured(p, cat, fmt=fmt, measured=True) for p in data]
    blocks = with_quantiles({h: hw.efficiency for h, hw in cat.hardware.items()}, measured_quantiles(sets, cat), cat)
    if write:
        for hid, eff in blocks.items():
            replace_efficiency_block(cat.files[hid], eff)
        clear_cache()
        typer.echo(f"wrote error quantiles into {len(blocks)} hardware files", err=True)
    payload = {h: b.error_quantiles for h, b in blocks.items()}
    if as_json:
        _echo_json(payload)
    else:
        for h, classes in payload.items():
            all_ = classes.get("all", {})
            typer.echo(f"{h}: {len(classes)} classes; all: q50 {all_.get('q50', float('nan')):.3f}, "
                       f"q90 {all_.get('q90', float('nan')):.3f}")


@calibrate_app.command("report")
def calibrate_report(
    data: Annotated[list[Path], typer.Option("--data", help="Measured rows (either format; repeatable).")],
    out: Annotated[Path, typer.Option("--out", help="Markdown report to write (plots beside it).")] = Path("docs/validation.md"),
    cv: Annotated[bool, typer.Option("--cv/--no-cv", help="Also run leave-one-hardware-out and leave-one-model-out cross-validation (slow).")] = True,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Worker processes for the cross-validation folds.")] = 2,
    folds: Annotated[list[str] | None, typer.Option("--folds", help="Which cross-validation to run: hardware, model (repeatable; default both).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing report and its plot.")] = False,
) -> None:
    """Write the validation report: error tables per file and group, residual plots, cross-validation, repeatability."""
    from planner.calib.report import plot_name, write_report
    from planner.export.files import check_file, staged

    bad = [f for f in (folds or []) if f not in ("hardware", "model")]
    if bad:
        raise InputError(f"--folds {bad[0]}: unknown; use hardware or model")

    check_file(out, force=force, option="--out")
    check_file(out.with_name(plot_name(out)), force=force, option="--out (its plot)")
    cat = _catalog()
    with staged(out.parent, force=force, unit=False) as stage:
        write_report(cat, data, stage / out.name, cross_validate=cv, jobs=jobs, folds=tuple(folds or ("hardware", "model")))
    typer.echo(f"wrote {out}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point. Exit codes: 0 success, 1 bad input or usage error (one line naming the flag or file), 2
    infeasible (with the diagnosis), 3 a limit reached without a plan. Anything else is reported on one line
    and exits 1; ``--debug`` shows the traceback instead."""
    err = _click_errors()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        rc = app(args=args, prog_name="planner", standalone_mode=False)
        if isinstance(rc, int) and rc:
            if rc == 130:  # typer's code for Ctrl-C inside a command (it catches the KeyboardInterrupt)
                sys.stderr.write("error: interrupted; nothing was written by this command unless it said so\n")
            sys.exit(rc)  # click returns typer.Exit's code instead of raising it when not standalone
    except PlannerError as exc:
        sys.stderr.write(f"error: {_one_line(str(exc))}\n")
        sys.exit(exc.exit_code)
    except err["NoArgsIsHelpError"] as exc:
        sys.stderr.write(exc.ctx.get_help() + "\n" if getattr(exc, "ctx", None) else "")
        sys.exit(1)
    except err["UsageError"] as exc:
        ctx = getattr(exc, "ctx", None)
        cmd = f" ({ctx.command_path})" if ctx is not None else ""
        sys.stderr.write(f"error: {_one_line(exc.format_message())}{cmd}; see --help\n")
        sys.exit(1)
    except err["Exit"] as exc:
        sys.exit(exc.exit_code)
    except (*err["Abort"], KeyboardInterrupt):
        sys.stderr.write("error: interrupted; nothing was written by this command unless it said so\n")
        sys.exit(1)
    except err["ClickException"] as exc:
        sys.stderr.write(f"error: {_one_line(exc.format_message())}\n")
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        if debug:
            raise
        sys.stderr.write(
            f"error: internal error ({type(exc).__name__}: {_one_line(str(exc))[:300]}); please report it, with "
            "the command; rerun with --debug for the traceback\n"
        )
        sys.exit(1)


def _click_errors() -> dict[str, tuple[type, ...]]:
    """click's exception classes, from the click package and from the copy recent typer versions vendor."""
    mods = []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mods.append(__import__(name, fromlist=["UsageError"]))
        except ImportError:
            continue
    names = ("NoArgsIsHelpError", "UsageError", "Exit", "Abort", "ClickException")
    return {n: tuple(getattr(m, n) for m in mods if hasattr(m, n)) for n in names}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
