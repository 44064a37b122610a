"""The ``planner`` command line's application: the Typer apps, what every command shares (the catalog, JSON out,
progress, refusing to overwrite) and :func:`main`, which turns every error into one line and an exit code.

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


FORMAT_HELP = "Measured-data format: silicon (CSV) or inferencex (JSON); detected when not given."

STATE: dict = {"catalog": None, "alone": False}


def cli_catalog():
    from planner.catalog import load_catalog

    return load_catalog(STATE["catalog"], alone=STATE["alone"])


def echo_json(obj) -> None:
    """One JSON document on stdout; a number that is not finite (a median over no rows) is written as null,
    never as the NaN or Infinity literals JSON does not have."""
    sys.stdout.write(json.dumps(finite(obj), indent=2, default=json_default, allow_nan=False) + "\n")


def finite(obj):
    import math

    import numpy as np

    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(float(obj)) else None
    return obj


def json_default(o):
    import datetime as dt

    import numpy as np

    if isinstance(o, (dt.date, dt.datetime)):
        return o.isoformat()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def check_engine(engine: str | None) -> str | None:
    """The catalog id of ``--engine`` (an id or alias), or None; exit 1 naming the flag when unknown."""
    if engine is None:
        return None
    return flag_value("--engine", cli_catalog().get_engine, engine).id


def flag_value(flag: str, lookup, ident: str):
    """A catalog lookup whose unknown-id error names the command-line flag."""
    try:
        return lookup(ident)
    except InputError as err:
        raise InputError(f"{flag}: {err}") from None


def refuse_overwrite(path: Path, force: bool, flag: str = "--force") -> None:
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
    STATE["catalog"] = catalog
    STATE["alone"] = catalog_alone


@contextmanager
def stages():
    """On a terminal, a spinner on stderr naming the stage a plan is in (gone when it ends); elsewhere nothing
    (logs and pipes get the one summary line, as before)."""
    if not sys.stderr.isatty():
        yield lambda _msg: None
        return
    from rich.console import Console

    t0 = time.perf_counter()
    with Console(stderr=True).status("planning") as status:
        yield lambda msg: status.update(f"{msg} ({time.perf_counter() - t0:.0f} s)")


def progress(label: str):
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


def catalog_root() -> Path:
    """Where ``models import`` writes without ``--out``: the user's catalog folder, or a checkout's catalogs/
    (never into an installed package)."""
    from planner.catalog.loader import bundled_catalog_dir, default_catalog_dir

    root = STATE["catalog"] or default_catalog_dir()
    if root is not None:
        return Path(root)
    bundled = bundled_catalog_dir()
    if bundled.name == "_catalogs":
        raise InputError("no catalog folder of your own to write into: pass --out FILE or --catalog DIR")
    return bundled


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
        sys.stderr.write(f"error: {one_line(str(exc))}\n")
        sys.exit(exc.exit_code)
    except err["NoArgsIsHelpError"] as exc:
        sys.stderr.write(exc.ctx.get_help() + "\n" if getattr(exc, "ctx", None) else "")
        sys.exit(1)
    except err["UsageError"] as exc:
        ctx = getattr(exc, "ctx", None)
        cmd = f" ({ctx.command_path})" if ctx is not None else ""
        sys.stderr.write(f"error: {one_line(exc.format_message())}{cmd}; see --help\n")
        sys.exit(1)
    except err["Exit"] as exc:
        sys.exit(exc.exit_code)
    except (*err["Abort"], KeyboardInterrupt):
        sys.stderr.write("error: interrupted; nothing was written by this command unless it said so\n")
        sys.exit(1)
    except err["ClickException"] as exc:
        sys.stderr.write(f"error: {one_line(exc.format_message())}\n")
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        if debug:
            raise
        sys.stderr.write(
            f"error: internal error ({type(exc).__name__}: {one_line(str(exc))[:300]}); please report it, with "
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


def one_line(text: str) -> str:
    return " ".join(str(text).split())

