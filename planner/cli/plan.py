"""Commands that plan: ``plan``, ``sweep``, ``price-curve``, ``insights``, ``export`` and ``schema``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import (
    STATE,
    app,
    check_engine,
    cli_catalog,
    echo_json,
    flag_value,
    progress,
    refuse_overwrite,
    stages,
)
from planner.errors import InputError, PlannerError


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
    from_plan: Annotated[
        Path | None, typer.Option("--from", help="Re-plan from this plan folder's deployed fleet (its units reserved over the horizon, the scenario's change_costs or their defaults): keep what pays, and write the migration.")
    ] = None,
) -> None:
    """Plan the cheapest deployment that meets a scenario's traffic and SLOs; write plan.md and plan.json."""
    import planner
    from planner.export.files import check_file, check_folder, owned_files
    from planner.export.plan import legacy_plan_files, plan_json, write_plan
    from planner.pipeline.plan import input_hash

    engine = check_engine(engine)
    rs = planner.load_scenario(scenario, cli_catalog(), engine=engine, existing=from_plan)
    target = out or Path("plans") / f"{rs.scenario.name}-{input_hash(rs, engine or rs.scenario.engine)[:8]}"
    check_folder(target, option="--out")
    if not force:
        for name in sorted(owned_files(target, legacy_plan_files)) + ["plan.md", "plan.json"]:
            refuse_overwrite(target / name, force)
    if lp is not None:
        check_file(lp, force=force, option="--lp")
    targets = None
    if export:
        from planner.export.bundle import parse_targets

        targets = parse_targets(export)
        check_folder(target / "export", option="--export (into --out/export)")
    opts = planner.PlanOptions(time_limit_s=time_limit, mip_gap=mip_gap, engine=engine, analysis=analysis,
                               lp_path=None if lp is None else str(lp), jobs=jobs)
    with stages() as say:
        res = planner.make_plan(rs, opts, progress=say)
    md, js = write_plan(res.plan, target, force=force, files=res.files)
    if targets:
        from planner.export.bundle import export_plan

        export_plan(target, targets, target / "export", cli_catalog(), force=True)
    p = res.plan
    head = (f"${p.day.usd_per_day:,.2f}/day, ${p.day.usd_per_mtok:,.4f}/M tokens over the day (peak period "
            f"${p.objective.usd_per_hour:,.2f}/h, ${p.objective.usd_per_mtok:,.4f}/M tokens)" if p.day is not None else
            f"${p.objective.usd_per_hour:,.2f}/h, ${p.objective.usd_per_mtok:,.4f}/M tokens")
    if p.migration is not None and p.migration.cost is not None:
        c = p.migration.cost
        head += (f"; from the deployed fleet ${c.usd_per_hour:,.2f}/h over {c.horizon_months:g} months, "
                 f"changes ${c.change_usd:,.0f}")
    typer.echo(
        f"{p.status}: {head}; "
        f"wrote {md} and {js} (candidates {res.timings['candidates_s']:.2f} s, solve {res.timings['solve_s']:.2f} s, "
        f"analysis {res.timings['analysis_s']:.2f} s)",
        err=True,
    )
    if as_json:
        sys.stdout.write(plan_json(p))


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
    from planner.export.files import check_folder, owned_files, staged
    from planner.options import PlanOptions
    from planner.sweep import check_sweep, iter_sweep, parse_vary, sweep_frame, tornado
    from planner.sweep.store import PartStore, sweep_identity

    engine = check_engine(engine)
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
            refuse_overwrite(target / name, force)
    cat = cli_catalog()
    total = check_sweep(base, scenario, varies, cat, max_points)
    opts = PlanOptions(time_limit_s=time_limit, mip_gap=mip_gap, engine=engine, analysis=False)
    store = PartStore(target, sweep_identity(base, varies, opts, cat), resume=resume, force=force)
    rows: dict[int, dict] = store.done() if resume else {}
    rows = {i: r for i, r in rows.items() if i < total}
    kept = len(rows)
    t0 = time.perf_counter()
    interrupted = _solve_points(rows, store, total, lambda skip: iter_sweep(
        base, scenario, varies, cat, catalog_root=STATE["catalog"], jobs=jobs, opts=opts, skip=skip, backend=backend,
        scheduler=scheduler))
    wall = time.perf_counter() - t0
    df = sweep_frame(rows, varies)
    written: list[Path] = []
    with staged(target, force=force or resume, unit=True, kind="sweep", written=written) as stage:
        _write_sweep(stage, df, paths, bool(rows))
        if with_tornado and not interrupted:
            _write_tornado(stage, lambda update: tornado(base, scenario, cat, opts=opts, progress=update))
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


def _solve_points(rows: dict[int, dict], store, total: int, points) -> bool:
    """Solve the points ``points(skip)`` yields into ``rows`` with a progress bar, saving them to ``store`` as they
    finish (a failed point is not saved: --resume solves it again); whether Ctrl-C stopped it."""
    bar, update = progress("sweep")
    interrupted = False
    buffer: list[tuple[int, dict]] = []
    flushed = time.perf_counter()
    if bar:
        bar.start()
    try:
        for idx, row in points(set(rows)):
            rows[idx] = row
            if row.get("status") != "failed":
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
    return interrupted


def _write_sweep(stage: Path, df, paths: list[str], any_rows: bool) -> None:
    """sweep.csv, and with points the cost plot and, where the sweep has per-user speeds, the Pareto front."""
    from planner.catalog.writer import atomic_write_text
    from planner.export import plots

    atomic_write_text(stage / "sweep.csv", df.to_csv(index=False))
    if not any_rows:
        return
    plots.cost_vs_inputs(df, paths, stage / "cost.png")
    first = next((c for c in df.columns if c.endswith(".tokens_per_s_per_user")), None)
    if first is not None:
        ok = df[df["status"].isin(["optimal", "feasible"])]
        plots.pareto(ok[first].to_numpy(), ok["usd_per_mtok_output"].to_numpy(), stage / "pareto.png",
                     title=f"Cost against interactivity ({first.split('.')[0]})")


def _write_tornado(stage: Path, run) -> None:
    """The tornado (``run(progress)``) into tornado.csv and tornado.png; skipped with a line where it fails or is
    interrupted."""
    from planner.catalog.writer import atomic_write_text
    from planner.export import plots

    bar, update = progress("tornado")
    if bar:
        bar.start()
    try:
        td = run(update)
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
    from planner.studies.pricing import price_curve

    engine = check_engine(engine)
    cat = cli_catalog()
    flag_value("--model", cat.get_model, model)
    for h in hardware or []:
        flag_value("--hardware", cat.get_hardware, h)
    pc = price_curve(cat, model, hardware, input_tokens=input_tokens, output_tokens=output_tokens,
                     ttft_ms=ttft_ms, engine=engine, weights=weights, kv=kv, margin_quantile=margin_quantile)
    if as_json:
        echo_json(pc.to_json())
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
    lifetime: Annotated[
        Path | None, typer.Option("--lifetime", help="Traffic scenario: add the lifetime-economics section (planner lifetime, dense and MoE, with its variants).")
    ] = None,
    lifetime_reference: Annotated[
        str, typer.Option("--lifetime-reference", help="N,D of the model whose loss (epoch law) is the section's target.")
    ] = "70.6e9,15e12",
    lifetime_volumes: Annotated[
        str, typer.Option("--lifetime-volumes", help="The section's lifetime volumes, tokens per day.")
    ] = "1e8:1e13:log:6",
) -> None:
    """How batch, context, sparsity, pipelining and scale-up domains set cost and latency, computed (and, with
    --lifetime, how big a model to train when serving costs what the planner says)."""
    from planner.export.files import check_file, check_folder, staged
    from planner.export.insights import command, write
    from planner.studies.insights import compute

    if len(model) != len(hardware):
        raise InputError("--model and --hardware: give them in pairs (one --hardware per --model)")
    engine = check_engine(engine)
    check_folder(out, option="--out")
    check_file(out / "insights.md", force=force, option="--out")
    cat = cli_catalog()
    for m, h in zip(model, hardware, strict=True):
        flag_value("--model", cat.get_model, m)
        flag_value("--hardware", cat.get_hardware, h)
    items = [compute(cat, m, h, context=context, engine=engine) for m, h in zip(model, hardware, strict=True)]
    runs, extra = [], []
    if lifetime is not None:
        runs = _lifetime_runs(cat, lifetime, lifetime_reference, lifetime_volumes)
        extra = ["--lifetime", str(lifetime), "--lifetime-reference", lifetime_reference,
                 "--lifetime-volumes", lifetime_volumes]
    with staged(out, force=force, unit=False) as stage:  # every file (plots included) refused without --force
        write(items, stage, command(list(zip(model, hardware, strict=True)), out, context, extra), runs,
              str(lifetime or ""))
    md = out / "insights.md"
    if as_json:
        js = [i.to_json() for i in items]
        echo_json(js[0] if len(js) == 1 else js)
    else:
        typer.echo(f"wrote {md}", err=True)


def _lifetime_runs(cat, scenario: Path, reference_text: str, volumes: str):
    """The lifetime section's sweeps: the dense and the MoE family at the reference model's loss, with variants."""
    import planner
    from planner.cli.lifetime import reference
    from planner.pipeline.lifetime import insights_runs
    from planner.sweep.points import parse_values

    ref = reference(reference_text, "--lifetime-reference")
    vols = list(parse_values(volumes, "--lifetime-volumes"))
    rs = planner.load_scenario(scenario, cat)
    with stages() as say:
        return insights_runs(rs, cat, ref, vols, progress=say)


@app.command("export")
def export_cmd(
    plan_dir: Annotated[Path, typer.Argument(help="Plan folder (with plan.json).")],
    target: Annotated[list[str], typer.Option("--target", help="sglang, vllm, trtllm, k8s or all (repeatable, or comma-separated).")],
    out: Annotated[Path | None, typer.Option("--out", help="Folder to write (default PLAN_DIR/export).")] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="Kubernetes namespace of the manifests.")] = "default",
    gateway: Annotated[str, typer.Option("--gateway", help="Gateway (Gateway API) the workloads' HTTPRoutes attach to.")] = "inference-gateway",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing export.")] = False,
    checkpoint: Annotated[
        list[str] | None, typer.Option("--checkpoint", help="POOL=PATH: the checkpoint a pool loads where no checkpoint of its weight format is published (repeatable).")
    ] = None,
    routing: Annotated[
        str, typer.Option("--routing", help="httproute (each pool a Service, weighted) or inference-pool (aggregated pools as Gateway API Inference Extension InferencePools).")
    ] = "httproute",
    rdma_resource: Annotated[
        str | None, typer.Option("--rdma-resource", help="Extended resource of the cluster's RDMA NICs (e.g. rdma/ib, nvidia.com/hostdev): requested by pods whose traffic crosses nodes (EP across hosts, KV hand-over outside an NVLink domain).")
    ] = None,
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
    given = {}
    for item in checkpoint or []:
        pool, sep, path = item.partition("=")
        if not sep or not pool or not path:
            raise InputError(f"--checkpoint: expected POOL=PATH, got '{item}'")
        given[pool] = path
    if routing not in ("httproute", "inference-pool"):
        raise InputError(f"--routing '{routing}': use httproute or inference-pool")
    if rdma_resource is not None and not re.fullmatch(r"([a-z0-9.-]+/)?[A-Za-z0-9_.-]+", rdma_resource):
        raise InputError(f"--rdma-resource '{rdma_resource}': an extended resource name is DOMAIN/NAME (rdma/ib)")
    doc = export_plan(plan_dir, targets, dest, cli_catalog(), force=force, namespace=namespace, gateway=gateway,
                      checkpoints=given, rdma_resource=rdma_resource, routing=routing)
    typer.echo(f"wrote {len(doc['files']) + 1} files under {dest} ({', '.join(targets)})"
               + (f"; not exported: {len(doc['skipped'])} (see export.json)" if doc["skipped"] else ""), err=True)


@app.command("diff")
def diff_cmd(
    plan_a: Annotated[Path, typer.Argument(help="The plan folder deployed now (plan.json).")],
    plan_b: Annotated[Path, typer.Argument(help="The plan folder to move to.")],
    as_json: Annotated[bool, typer.Option("--json", help="The diff and steps as JSON on stdout.")] = False,
) -> None:
    """What moving from PLAN_A's fleet to PLAN_B's changes: units added and released, pools kept, resized or
    reconfigured (replicas before and after), and the steps that never drop capacity below demand."""
    from planner.export.bundle import read_plan
    from planner.export.migration import diff_lines, step_lines
    from planner.results.migration import diff_plans

    units, pools, steps = diff_plans(read_plan(plan_a), read_plan(plan_b))
    if as_json:
        echo_json({"from": str(plan_a), "to": str(plan_b), "units": [u.model_dump() for u in units],
                   "pools": [p.model_dump() for p in pools], "steps": [s.model_dump() for s in steps]})
        return
    typer.echo("\n".join([f"# {plan_a} -> {plan_b}", ""] + diff_lines(units, pools) + ["", "Steps:", ""] + step_lines(steps)))


@app.command("schema")
def schema_cmd(
    what: Annotated[str, typer.Argument(help="plan: the JSON Schema of plan.json.")],
) -> None:
    """Print the JSON Schema of a file the planner writes (the contract programs read)."""
    from planner.results import Plan

    if what != "plan":
        raise InputError(f"schema: unknown document '{what}'; use plan")
    echo_json(Plan.model_json_schema())

