"""Commands on the catalogs: ``catalog list|show|validate`` and ``models import``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import (
    catalog_app,
    catalog_root,
    cli_catalog,
    echo_json,
    models_app,
)
from planner.errors import InputError


@catalog_app.command("list")
def catalog_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Every model and hardware entry with its key figures."""
    from planner.export.catalog import catalog_summary

    data = catalog_summary(cli_catalog())
    if as_json:
        echo_json(data)
        return
    from planner.export.text import catalog_text

    typer.echo(catalog_text(data))


@catalog_app.command("show")
def catalog_show(ident: Annotated[str, typer.Argument(help="Model or hardware id (or alias).")],
                 as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """One entry, with the figures derived from it."""
    from planner.export.catalog import entry_detail

    cat = cli_catalog()
    data = entry_detail(cat, ident)
    if as_json:
        echo_json(data)
        return
    from planner.catalog.writer import dump_yaml

    typer.echo(dump_yaml(data).rstrip())


@catalog_app.command("validate")
def catalog_validate() -> None:
    """Load every catalog file through the strict schemas and cross-check ids, aliases and sources."""
    from planner.export.catalog import validate_catalog

    cat = cli_catalog()
    notes = validate_catalog(cat)
    for n in notes:
        typer.echo(f"note: {n}", err=True)
    where = f"{cat.root} over the bundled catalog" if cat.layered else str(cat.root)
    typer.echo(f"ok: {len(cat.hardware)} hardware and {len(cat.models)} model entries in {where}")


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
    target = out or (catalog_root() / "models" / f"{ident}.yaml")
    check_file(target, force=force, option="--out")
    atomic_write_text(target, text)
    typer.echo(f"wrote {target}", err=True)

