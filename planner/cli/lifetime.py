"""``planner lifetime``: how big a model to train, and for how long, when serving costs what the planner says."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import app, cli_catalog, echo_json, flag_value, refuse_overwrite, stages
from planner.errors import InputError
from planner.studies.scaling import SPARSE_EXPONENT


@app.command()
def lifetime(
    scenario: Annotated[Path, typer.Argument(help="Traffic scenario (workload mix, SLOs, serving hardware); its demand is scaled to each volume.")],
    family: Annotated[
        str, typer.Option("--family", help="Model families, comma-separated: llama3, qwen3 (dense), qwen3-moe (MoE).")
    ] = "llama3,qwen3-moe",
    loss: Annotated[float | None, typer.Option("--loss", help="Loss target under --law.")] = None,
    as_good_as: Annotated[
        str | None, typer.Option("--as-good-as", help="N,D: the loss of a model of N parameters trained on D tokens (e.g. 70.6e9,15e12 for Llama 3.1 70B; a MoE reference: its effective N, sqrt(total x active)).")
    ] = None,
    law: Annotated[str, typer.Option("--law", help="chinchilla (Hoffmann et al. 2022) or epoch (Besiroglu et al. 2024).")] = "epoch",
    volumes: Annotated[
        str, typer.Option("--volumes", help="Serving volumes, tokens per day: a list (1e9,1e10) or a range lo:hi:log:n.")
    ] = "1e8:1e13:log:20",
    life_days: Annotated[float, typer.Option("--life-days", help="Days the model serves.")] = 365.0,
    train_hardware: Annotated[str, typer.Option("--train-hardware", help="Training accelerator (catalog id).")] = "h100-sxm",
    mfu: Annotated[float, typer.Option("--mfu", help="Training model-FLOPs utilisation of the bf16 peak, (0, 1].")] = 0.4,
    train_price: Annotated[
        float | None, typer.Option("--train-price", help="Training USD per chip-hour (default: the catalog price).")
    ] = None,
    unique_tokens: Annotated[
        float | None, typer.Option("--unique-tokens", help="Unique training tokens available (repeats priced per Muennighoff et al. 2023).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for lifetime.md and lifetime.png.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing lifetime.md.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The sweep as JSON on stdout.")] = False,
    with_variants: Annotated[
        bool, typer.Option("--variants", help="Also re-run the sweep on a faster serving tier and on small and large scale-up domains (how the answer moves).")
    ] = False,
    experts: Annotated[
        int | None, typer.Option("--experts", help="Routed experts of the MoE family's models (top-k kept; default the members').")
    ] = None,
    sparse_exponent: Annotated[
        float, typer.Option("--sparse-exponent", help="s of a MoE's effective parameters N_active (N_total/N_active)^s, in [0, 1].")
    ] = SPARSE_EXPONENT,
    jobs: Annotated[int | None, typer.Option("--jobs", min=1, help="Processes the sizes are spread over (default: one per core, up to 4).")] = None,
) -> None:
    """Choose the parameters N and training tokens D that minimise training plus lifetime serving cost at a loss
    target, per lifetime volume, beside the 2N-FLOPs-per-token assumption."""
    import planner
    from planner.catalog.writer import atomic_write_text
    from planner.export.lifetime import lifetime_json, lifetime_markdown, lifetime_plot
    from planner.pipeline.lifetime import LifetimeInputs, run_families
    from planner.studies.family import SPARSE_FAMILIES
    from planner.studies.scaling import LAWS
    from planner.sweep.points import parse_values

    cat = cli_catalog()
    flag_value("--train-hardware", cat.get_hardware, train_hardware)
    if law not in LAWS:
        raise InputError(f"--law: '{law}' is not known; use {', '.join(LAWS)}")
    if (loss is None) == (as_good_as is None):
        raise InputError("give the loss target as --loss L or --as-good-as N,D (one of them)")
    if as_good_as is not None:
        loss = LAWS[law].loss(*reference(as_good_as, "--as-good-as"))
    fams = [f.strip() for f in family.split(",") if f.strip()]
    if not fams:
        raise InputError("--family: give at least one family")
    inputs = [LifetimeInputs(f, law, float(loss), list(parse_values(volumes, "--volumes")), life_days,
                             cat.get_hardware(train_hardware).id, mfu, train_price, unique_tokens,
                             experts=experts if f in SPARSE_FAMILIES else None, sparse_exponent=sparse_exponent)
              for f in fams]
    if experts is not None and not any(i.sparse for i in inputs):
        raise InputError(f"--experts: needs a MoE family in --family ({', '.join(SPARSE_FAMILIES)})")
    for i in inputs:
        i.check()
    target = out or Path("lifetime")
    if out is not None or not as_json:
        refuse_overwrite(target / "lifetime.md", force)
    rs = planner.load_scenario(scenario, cat)
    with stages() as say:
        runs = run_families(inputs, rs, cat, with_variants=with_variants, progress=say, jobs=jobs)
    if out is not None or not as_json:
        target.mkdir(parents=True, exist_ok=True)
        md = lifetime_markdown(runs, str(scenario)) + f"\nRegenerate: `{command_line()}`\n"
        atomic_write_text(target / "lifetime.md", md)
        lifetime_plot(runs, target / "lifetime.png")
        typer.echo(f"wrote {target / 'lifetime.md'} and {target / 'lifetime.png'}", err=True)
    if as_json:
        echo_json(lifetime_json(runs))


def reference(text: str, option: str) -> tuple[float, float]:
    """``N,D`` of a reference model (its published parameters and training tokens)."""
    try:
        n, d = (float(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"{option}: expected N,D (parameters,tokens), got '{text}'") from None
    if not (n > 0 and d > 0 and math.isfinite(n) and math.isfinite(d)):
        raise InputError(f"{option}: N and D must be positive numbers, got '{text}'")
    return n, d


def command_line() -> str:
    """The command as run (for the report's regeneration line)."""
    import shlex
    import sys

    return "planner " + " ".join(shlex.quote(a) for a in sys.argv[1:])
