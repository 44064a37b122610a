"""Commands that calibrate: ``calibrate fit|kernels|margins|report``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import (
    FORMAT_HELP,
    calibrate_app,
    cli_catalog,
    echo_json,
)
from planner.errors import InputError


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

    cat = cli_catalog()
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
        echo_json(payload)
    else:
        for hid, b in blocks.items():
            typer.echo(f"{hid}: {b.fitted_rows} rows; default {b.default.model_dump()}")
            for eng, own in sorted(b.free_factors.items()):
                typer.echo(f"  {eng}: {len(own)} factors of its own ({', '.join(own) or 'none'})")


@calibrate_app.command("kernels")
def calibrate_kernels(
    data: Annotated[Path, typer.Option("--data", help="Kernel measurements: a folder SYSTEM/FAMILY/ENGINE/FILE.parquet (../shared/calibration/kernels).")],
    system: Annotated[list[str] | None, typer.Option("--system", help="Fit only this system folder (repeatable).")] = None,
    family: Annotated[list[str] | None, typer.Option("--family", help="Fit only this family: gemm, moe, attn_decode, mla_decode, attn_context, mla_context, collective, deepep, alltoall (repeatable).")] = None,
    write: Annotated[bool, typer.Option("--write", help="Store the curves in the efficiency blocks of the catalog's hardware files.")] = False,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Processes, one system each.")] = 2,
    report: Annotated[Path | None, typer.Option("--report", help="Write the fit errors per family and system as Markdown, with a residual plot beside it (docs/kernels.md).")] = None,
    compose: Annotated[bool | None, typer.Option("--compose/--no-compose", help="With --write: compose the calibrated step from these curves (refit the end-to-end factors after: calibrate fit --write). Default: as the catalog has it (off for a new block).")] = None,
    terms: Annotated[str | None, typer.Option("--terms", help="With --write: the terms of the calibrated roofline step these curves time, comma-separated: moe, all_reduce, exchange, attention, prefill_attention, trtllm_exchange ('' for none; refit the end-to-end factors after). Default: as the catalog has it (none for a new block).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --report and its plot.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Fit each term of the step (GEMM, fused MoE, decode and prefill attention and MLA, collectives, DeepEP, TensorRT-LLM's all-to-all) on measured
    kernel latencies, per system, engine and format; scored on shapes held out of the fit."""
    from planner.calib.kernel_report import curve_table, family_table, plot_residuals, report_markdown
    from planner.calib.kernels import fit_kernels, kernel_block
    from planner.catalog.kernel_fits import KERNEL_TERMS
    from planner.catalog.loader import clear_cache
    from planner.catalog.writer import atomic_write_text, atomic_write_with, replace_efficiency_block
    from planner.export.files import check_file
    from planner.perf.kernels import PARAMS

    bad = [f for f in (family or []) if f not in PARAMS]
    if bad:
        raise InputError(f"--family {bad[0]}: unknown (known: {', '.join(PARAMS)})")
    if compose is not None and not write:
        raise InputError("--compose/--no-compose sets the catalog's kernel blocks: give it with --write")
    if terms is not None and not write:
        raise InputError("--terms sets the catalog's kernel blocks: give it with --write")
    term_list = list(dict.fromkeys(t.strip() for t in terms.split(",") if t.strip())) if terms is not None else None
    unknown = [t for t in term_list or [] if t not in KERNEL_TERMS]
    if unknown:
        raise InputError(f"--terms {unknown[0]}: unknown (known: {', '.join(KERNEL_TERMS)})")
    plot = report.with_name(report.stem + "-residuals.png") if report else None
    if report:
        check_file(report, force=force, option="--report")
        check_file(plot, force=force, option="--report (its plot)")
    cat = cli_catalog()
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
            kept = term_list if term_list is not None else (list(old.terms) if old is not None else [])
            # the curves an end-to-end fit overruled stay so until the next `calibrate fit` decides again
            block = block.model_copy(update={"compose": on, "terms": kept,
                                             "overruled": list(old.overruled) if old is not None else []})
            if old is not None and family:
                # A refit of some families keeps the other families' curves of the block (and replaces every curve of
                # the refitted families, whatever their keys were).
                others = {k: c for k, c in old.curves.items() if k.split("/", 1)[0] not in family}
                block = block.model_copy(update={"curves": {**others, **block.curves},
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
        echo_json({"families": fam.to_dict(orient="records"), "curves": curve_table(reports).to_dict(orient="records"),
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

    cat = cli_catalog()
    sets = [load_measured(p, cat, fmt=fmt, measured=True) for p in data]
    blocks = with_quantiles({h: hw.efficiency for h, hw in cat.hardware.items()}, measured_quantiles(sets, cat), cat)
    if write:
        for hid, eff in blocks.items():
            replace_efficiency_block(cat.files[hid], eff)
        clear_cache()
        typer.echo(f"wrote error quantiles into {len(blocks)} hardware files", err=True)
    payload = {h: b.error_quantiles for h, b in blocks.items()}
    if as_json:
        echo_json(payload)
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
    cat = cli_catalog()
    with staged(out.parent, force=force, unit=False) as stage:
        write_report(cat, data, stage / out.name, cross_validate=cv, jobs=jobs, folds=tuple(folds or ("hardware", "model")))
    typer.echo(f"wrote {out}", err=True)

