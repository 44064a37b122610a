"""Commands that study the physics: ``experts``, ``roofline``, ``predict`` and ``validate``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import (
    FORMAT_HELP,
    app,
    cli_catalog,
    echo_json,
    flag_value,
)
from planner.errors import InputError


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
    from planner.export.files import check_file
    from planner.perf.experts import parse_skew, zipf_loads
    from planner.perf.params import model_stats
    from planner.pipeline.experts import (
        check_memory,
        check_shape,
        choose_redundant,
        place_layers,
        placement_map,
    )

    cat = cli_catalog()
    m = flag_value("--model", cat.get_model, model)
    if not m.is_moe:
        raise InputError(f"--model {m.id}: a dense model has no experts to place")
    hw = flag_value("--hardware", cat.get_hardware, hardware) if hardware else None
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
        echo_json(out)
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
    from planner.perf.setup import engine_options
    from planner.units import DTYPES

    cat = cli_catalog()
    m = flag_value("--model", cat.get_model, model)
    hw = flag_value("--hardware", cat.get_hardware, hardware)
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
        eng = flag_value("--engine", cat.get_engine, engine)
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
                       tbo=1.0 if tbo else 0.0, engine=eng.id if eng else None, **engine_options(eng))
    mode = "ideal" if ideal else "calibrated"
    from planner.export.text import prefill_text, roofline_text

    if phase == "prefill":
        pres = prefill_roofline(setup, layout, batch, context, prefix=prefix, mode=mode, engine=eng.id if eng else None)
        if not allow_misfit:
            require_fit(pres, layout, hw.hbm_bytes)
        if as_json:
            echo_json(pres.to_dict())
        else:
            typer.echo(prefill_text(pres))
        return
    res = run(setup, layout, batch, context, mode=mode, engine=eng.id if eng else None)
    if not allow_misfit:
        require_fit(res, layout, hw.hbm_bytes)
    if as_json:
        echo_json(res.to_dict())
        return
    typer.echo(roofline_text(res))




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
    cat = cli_catalog()
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
    from planner.calib.metrics import evaluation_frame, format_table, format_tail_table, frame_summary
    from planner.calib.predict import notes, predict_normalised

    cat = cli_catalog()
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
        echo_json(next(iter(summaries.values())) if len(summaries) == 1 else {"files": summaries})
        return
    for path, sm in summaries.items():
        typer.echo(f"{path}\n\nOverall\n" + format_table([sm["overall"]], []))
        for key, cols, title in (("by_system", ["system"], "Per system"), ("by_engine", ["engine"], "Per engine"),
                                 ("by_mode", ["mode"], "Per serving mode"), ("by_spec", ["spec"], "Speculative decoding"),
                                 ("by_concurrency", ["conc_band"], "Per concurrency band"),
                                 ("by_deployment", ["deployment"], "Deployment recorded in the file or assumed")):
            typer.echo(f"\n{title}\n" + format_table(sm[key], cols))
        tails = format_tail_table([sm["overall"]], [])
        if tails:
            typer.echo("\nTails (p99 and ITL beside the medians)\n" + tails)
            for key, cols in (("by_mode", ["mode"]), ("by_spec", ["spec"]), ("by_system", ["system"])):
                typer.echo("\n" + format_tail_table(sm[key], cols))
        typer.echo("")



@app.command()
def simulate(
    plan_dir: Annotated[Path, typer.Argument(help="A plan folder (plan.json) written by `planner plan`.")],
    requests: Annotated[int, typer.Option("--requests", min=100, max=10_000_000, help="Requests to simulate (split over the workloads by demand).")] = 100_000,
    seed: Annotated[int, typer.Option("--seed", min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Simulate the plan's pools (Poisson arrivals, routing, batch slots, prefill queues, chunk steps) and print
    simulated p50/p90/p99 TTFT, TPOT and ITL and the share meeting the SLOs beside the plan's predictions."""
    import time

    from planner.analysis.simulate import simulate as run
    from planner.analysis.simulate import summary
    from planner.export.bundle import read_plan

    plan = read_plan(plan_dir)
    t0 = time.perf_counter()
    rows = summary(plan, run(plan, requests=requests, seed=seed))
    wall = time.perf_counter() - t0
    if as_json:
        echo_json({"plan": str(plan_dir), "requests": requests, "seed": seed, "wall_s": wall, "rows": rows})
        return
    typer.echo(format_simulation(rows) + f"\n{requests:,} requests, seed {seed}, {wall:.1f} s; ± is the 95% confidence "
               "interval of a share (batch means): a plan short of its target by less is within sampling error, more "
               "requests narrow it")


def format_simulation(rows: list[dict]) -> str:
    """The simulation's rows as text: per workload, its attainment against the plan's, then each pool's
    simulated and predicted percentiles."""
    from planner.catalog.scenario import quantile_label

    def ms(v):
        return "-" if v is None else f"{v:,.1f}"

    def share(r, key):
        ci = r.get(f"{key}_ci")
        return f"{r[key]:.2%}" + ("" if ci is None else f" ± {ci:.2%}")  # None: too few requests (summary)

    out = []
    for r in rows:
        if r["pool"] == "(all)":
            good = "" if r["slo_goodput"] is None else f" (target {r['slo_goodput']:.0%})"
            out.append(f"{r['workload']}: {r['requests']:,} requests; within the {quantile_label(r['slo_ttft_quantile'])} "
                       f"TTFT target {share(r, 'ttft_within')} (predicted {r['pred_ttft_attainment']:.2%}), within the "
                       f"{quantile_label(r['slo_tpot_quantile'])} TPOT target {share(r, 'tpot_within')} (predicted "
                       f"{r['pred_tpot_attainment']:.2%}), both {share(r, 'goodput')} (predicted {r['pred_goodput']:.2%})"
                       f"{good}")
            continue
        parts = []
        for k in ("ttft", "tpot"):
            if r.get(f"{k}_p50_ms") is not None:
                sim = " / ".join(ms(r[f"{k}_p{q}_ms"]) for q in (50, 90, 99))
                pred = " / ".join(ms(r.get(f"pred_{k}_p{q}_ms")) for q in (50, 90, 99))
                parts.append(f"{k.upper()} {sim} ms (predicted {pred})")
        if r.get("itl_p50_ms") is not None:
            parts.append("ITL " + " / ".join(ms(r[f"itl_p{q}_ms"]) for q in (50, 90, 99)) + " ms")
        out.append(f"  {r['pool']} ({r['requests']:,} requests), p50 / p90 / p99: " + "; ".join(parts))
    return "\n".join(out)
