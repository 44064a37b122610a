"""A plan as Markdown (for people) and JSON (for programs), and writing both atomically."""

from __future__ import annotations

import json
from pathlib import Path

from planner.catalog.scenario import quantile_label
from planner.catalog.writer import atomic_write_text
from planner.export.files import staged
from planner.results import Plan


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json"), indent=2) + "\n"


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f}"


def _ms(x: float) -> str:
    return f"{x * 1e3:,.0f} ms" if x >= 0.1 else f"{x * 1e3:,.1f} ms"


def _usd(x: float) -> str:
    return f"${x:,.2f}"


def _usd_tok(x: float) -> str:
    """Dollars per million tokens: four decimals below a dollar (cents hide the differences)."""
    return f"${x:,.4f}" if abs(x) < 1 else f"${x:,.2f}"


def _periods_status(plan: Plan) -> str:
    ps = plan.periods_solver or {}
    gap = ps.get("mip_gap")
    if ps.get("status") == "optimal":
        return f"The period plan is proven optimal ({ps.get('wall_s', 0):.1f} s)."
    return (f"The period plan is feasible, within {gap:.2%} of optimal when the time limit stopped the solver "
            f"({ps.get('wall_s', 0):.1f} s)." if gap is not None else "The period plan is feasible.")


def summary(plan: Plan) -> str:
    sc = plan.scenario
    o = plan.objective
    fleet = ", ".join(f"{g.count} {g.kind}{'s' if g.count != 1 else ''} of {g.hardware} ({g.chips} chips)" for g in plan.units)
    several = len(sc.get("models") or []) > 1
    model_of = {p.workload: p.model for p in plan.pools}
    wl = "; ".join(
        (f"{w.name} ({model_of.get(w.name, '?')}) " if several else f"{w.name} ") + f"{w.requests_per_s:g} req/s ({w.input_tokens:,} in / {w.output_tokens:,} out tokens, {w.serving})"
        for w in plan.workloads
    )
    gap = plan.solver.mip_gap
    proof = "proven optimal" if plan.status == "optimal" else f"feasible, within {gap:.2%} of optimal" if gap is not None else "feasible"
    checked = plan.recheck is not None and plan.recheck.ok
    claim = (
        "Every pool meets its workload's TTFT and TPOT targets (re-checked by the performance model alone)"
        if checked else "The plan was not re-checked"
    )
    unval = sorted({p.hardware for p in plan.pools if p.unvalidated})
    caveat = f" Unvalidated hardware (factors transferred, no measured rows): {', '.join(unval)}." if unval else ""
    if plan.day is not None:  # a traffic profile: the day is the headline, the peak period's fleet beside it
        d = plan.day
        cost = (f"{_usd(d.usd_per_day)}/day, {_usd_tok(d.usd_per_mtok)} per million tokens over the day's "
                f"{d.tokens_per_day / 1e6:,.1f}M tokens ({_usd_tok(d.usd_per_mtok_output)} per million output tokens); "
                f"at the peak period on {fleet} {_usd(o.usd_per_hour)}/h, {_usd_tok(o.usd_per_mtok)} per million tokens; ")
        where = ""
        wl = wl.replace(" req/s", " req/s at peak")
    else:
        cost = (f"{_usd(o.usd_per_hour)}/h, {_usd_tok(o.usd_per_mtok)} per million tokens ({_usd_tok(o.usd_per_mtok_input)} "
                f"input, {_usd_tok(o.usd_per_mtok_output)} output); ")
        where = f" on {fleet}"
    return (
        f"Serve {', '.join(sc['models']) if several else sc['model']} for {wl}{where} at {cost}"
        f"{proof} (HiGHS, gap {gap if gap is not None else float('nan'):.1e}, {plan.solver.wall_s:.2f} s). "
        f"{claim}; {plan.solver.candidates.get('kept', 0):,} candidate rows considered "
        f"out of {plan.solver.candidates.get('evaluated', 0):,} evaluated.{caveat}"
    )


def _bill(plan: Plan) -> list[str]:
    """The bill of materials: units, chips, $/h and kW per hardware."""
    L: list[str] = []
    L += ["## Bill of materials", "", "| hardware | units | chips | chips used | $/h | kW |", "|---|---:|---:|---:|---:|---:|"]
    for g in plan.units:
        kw = f"{g.kw:,.0f}" if g.kw is not None else "n/a"
        L.append(f"| {g.hardware} | {g.count} {g.kind}{'s' if g.count != 1 else ''} | {g.chips} | {g.chips_used} | {_usd(g.usd_per_hour)} | {kw} |")
    tot_kw = sum(g.kw or 0 for g in plan.units)
    L.append(f"| **total** | | {sum(g.chips for g in plan.units)} | {sum(g.chips_used for g in plan.units)} | **{_usd(plan.objective.usd_per_hour)}** | {tot_kw:,.0f} |")
    return L


def _pool(plan: Plan, p) -> list[str]:
    """One pool: layout, batch and tiers, physics, memory, experts, latency, router share and capacity."""
    L: list[str] = []
    sc = plan.scenario
    w = next(w for w in plan.workloads if w.name == p.workload)
    lay = p.layout
    mem = p.memory_per_chip_bytes
    pr = p.predicted
    of = f" of {p.model}" if len(sc.get("models") or []) > 1 else ""
    L += [f"### {p.id}: {p.replicas} x {p.role} replica{'s' if p.replicas != 1 else ''}{of} on {p.hardware} with {p.engine}", ""]
    L.append(
        f"- layout: {lay.notation} = {p.chips_per_replica} GPU{'s' if p.chips_per_replica != 1 else ''} per replica "
        f"(one engine instance; tp {lay.tp}, ep {lay.ep}, pp {lay.pp}, attn_dp {lay.attn_dp}"
        f"{f', {lay.redundant_experts} redundant experts' if lay.redundant_experts else ''})"
        f"{' spanning scale-out' if p.scale_out else ''}"
    )
    tech = []
    if p.spec_tokens:
        tech.append(f"speculative decoding ({p.spec_method or 'draft'}, {p.spec_tokens} draft token{'s' if p.spec_tokens != 1 else ''}, "
                    f"{p.tokens_per_step:.2f} tokens per step)")
    if p.two_batch_overlap:
        tech.append("two micro-batch overlap")
    wmode = " weight-only (bf16 maths)" if p.weights_mode == "weight-only" else ""
    L.append(
        f"- batch {p.batch} sequences per replica; weights {p.weights_dtype}{wmode}, KV cache {p.kv_dtype} in {p.kv_tier}; "
        f"prefix cache: {p.prefix_tier}" + (f"; {', '.join(tech)}" if tech else "")
    )
    factors = f"physics: {p.physics}; factors: {p.factors} for {p.engine} on {p.hardware}"
    L.append(f"- {factors}" + (f"; **{p.unvalidated}**" if p.unvalidated else ""))
    host = f", {_gb(mem.host_kv)} GB KV in host DRAM" if mem.host_kv > 0 else ""
    L.append(
        f"- memory per chip (GB): weights {_gb(mem.weights)}, KV {_gb(mem.kv)}, other {_gb(mem.other)}, "
        f"free {_gb(mem.free)} of {_gb(mem.capacity)}{host}"
    )
    if p.expert_placement is not None:
        xp = p.expert_placement
        placed = ""
        if xp.placement_imbalance is not None:
            placed = (f"; MILP placement {xp.placement_imbalance:.3f} (greedy EPLB {xp.greedy_imbalance:.3f}, "
                      f"gap {xp.mip_gap:.2%}) in `{xp.map_file}`")
        L.append(
            f"- experts: {xp.slots_per_gpu} slots per GPU over {xp.gpus} GPUs, {xp.redundant_experts} redundant; "
            f"step time carries imbalance {xp.imbalance:.3f}{placed}"
        )
    if p.prefix_tier != "none":
        L.append(f"- cached prefixes: {_gb(p.prefix_cache_bytes_per_replica)} GB per replica in {p.prefix_tier}")
    lat = []
    lt = pr.latency
    qt, qp = quantile_label(w.slo_ttft_quantile), quantile_label(w.slo_tpot_quantile)
    if p.role != "decode":
        lat.append(f"{qt} TTFT {_ms(pr.ttft_s)} at the planned load, {_ms(pr.ttft_at_capacity_s)} at capacity "
                   f"(target {_ms(w.slo_ttft_s)})")
    if p.role != "prefill":
        lat.append(f"{qp} TPOT {_ms(lt.tpot_slo_s or pr.tpot_s)}, mean {_ms(pr.tpot_s)} (target {_ms(w.slo_tpot_s)})")
    L.append(f"- predicted: {', '.join(lat)}; bound by {p.bound}")
    dist = []
    if p.role != "decode":
        dist.append(f"TTFT {_pcts(lt.ttft)} ({lt.ttft_attainment:.1%} within target)")
    if p.role != "prefill":
        dist.append(f"TPOT {_pcts(lt.tpot)} ({lt.tpot_attainment:.1%} within target), ITL {_pcts(lt.itl)}")
    L.append(f"- p50 / p90 / p99 at the planned load: {'; '.join(dist)}")
    peers = [q for q in plan.pools if q.workload == p.workload and q.role == p.role]
    if len(peers) > 1:
        how = "prefix families hashed" if p.prefix_tier != "none" else "requests"
        L.append(f"- router: {p.router_share:.1%} of {p.workload}'s {p.role} {how} go here (by capacity)")
    if p.margin_derate != 1.0:
        L.append(f"- capacity derated by {p.margin_derate:.3f} (the model's measured error at the scenario's margin "
                 f"quantile for {p.hardware} {p.engine}): {pr.requests_per_s * p.margin_derate:,.2f} req/s at the prediction")
    L.append(
        f"- capacity {pr.requests_per_s:,.2f} req/s ({pr.requests_per_s_per_replica:,.3f} per replica), "
        f"{pr.input_tokens_per_s:,.0f} input and {pr.output_tokens_per_s:,.0f} output tokens/s, "
        f"{pr.utilisation:.0%} used by the demand; cost {_usd(p.usd_per_hour)}/h"
    )
    L.append("")
    return L


def _workloads(plan: Plan) -> list[str]:
    """Each workload's demand, capacity and latency against its targets."""
    L: list[str] = []
    L += ["## Workloads", "",
          "| workload | demand req/s | capacity req/s | TTFT / target | TPOT / target | within TTFT / TPOT / both | serving |",
          "|---|---:|---:|---|---|---|---|"]
    for w in plan.workloads:
        cap = f"{w.served_requests_per_s:,.2f}"
        if w.served_at_prediction_rps is not None:
            cap += f" ({w.served_at_prediction_rps:,.2f} at the prediction)"
        good = f"{w.goodput:.1%}" + (f" (goodput target {w.slo_goodput:.0%})" if w.slo_goodput is not None else "")
        L.append(
            f"| {w.name} | {w.requests_per_s:g} | {cap} | {quantile_label(w.slo_ttft_quantile)} {_ms(w.ttft_s)} / "
            f"{_ms(w.slo_ttft_s)} | {quantile_label(w.slo_tpot_quantile)} {_ms(w.tpot_s)} / {_ms(w.slo_tpot_s)} | "
            f"{w.ttft_attainment:.1%} / {w.tpot_attainment:.1%} / {good} | {w.serving} |"
        )
    L += ["", "Shares within target are predicted at the planned load (open arrivals); `planner simulate` checks them "
              "by simulating the pools."]
    return L


def _pcts(p) -> str:
    return f"{_ms(p.p50)} / {_ms(p.p90)} / {_ms(p.p99)}"


def _resilience(plan: Plan) -> list[str]:
    """What losing the worst units leaves each workload, and what the headroom costs."""
    L: list[str] = []
    if plan.resilience is not None:
        r = plan.resilience
        L += ["", f"## Resilience: any {r.lose_units} unit{'s' if r.lose_units != 1 else ''} may fail", ""]
        for w in plan.workloads:
            cap = r.capacity_after_worst_loss_rps.get(w.name, 0.0)
            units = ", ".join(r.worst_units.get(w.name, []))
            L.append(f"- {w.name}: {cap:,.2f} req/s left after losing {units or 'the worst units'} "
                     f"(demand {w.requests_per_s:g} req/s)")
        head = "not priced (analysis off)" if r.headroom_usd_per_hour is None else f"${r.headroom_usd_per_hour:,.2f}/h"
        L.append(f"- the headroom costs {head} over the cheapest plan without it")
    return L


def _periods(plan: Plan) -> list[str]:
    """The fleet period by period over a traffic profile."""
    L: list[str] = []
    if plan.periods:
        T = len(plan.periods)
        saving = 1.0 - plan.usd_per_day / plan.flat_peak_usd_per_day if plan.flat_peak_usd_per_day else 0.0
        L += ["", "## Fleet over the day", "",
              f"Traffic follows a profile of {T} periods ({24 / T:g} h each). The pools above are the peak period's "
              f"fleet; provisioned flat all day it costs ${plan.flat_peak_usd_per_day:,.2f}/day. Buying reserved units "
              f"for the whole day and on-demand or spot units per period costs **${plan.usd_per_day:,.2f}/day** "
              f"({saving:.1%} less). Every period's fleet is re-checked by the performance model alone"
              + (f", with its worst {plan.resilience.lose_units} unit(s) lost. " if plan.resilience else ". ")
              + _periods_status(plan), "",
              "![fleet per period](periods.png)", "",
              "| period | requests/s | capacity req/s | units (reserved + on-demand + spot) | $/h | re-check |",
              "|---:|---|---|---|---:|---|"]
        for p in plan.periods:
            req = ", ".join(f"{w} {v:g}" for w, v in p.requests_per_s.items())
            cap = ", ".join(f"{w} {v:,.1f}" for w, v in p.capacity_rps.items())
            units = "; ".join(f"{u.hardware} {u.reserved}+{u.on_demand}+{u.spot}" for u in p.units) or "none"
            L.append(f"| {p.period} | {req} | {cap} | {units} | {_usd(p.usd_per_hour)} | {'ok' if p.recheck_ok else 'FAILED'} |")
    return L


def _months(plan: Plan) -> list[str]:
    """Growth month by month: what to reserve when, what to rent on demand, and the horizon's cost."""
    g = plan.growth
    if g is None:
        return []
    saving = 1.0 - g.usd_total / g.peak_reserved_usd_total if g.peak_reserved_usd_total else 0.0
    lead = plan.migration.lead_time_days if plan.migration is not None else 0.0
    L = ["", f"## Growth over {g.months} months", "",
         f"Demand grows month by month. Reserving units when they are first needed (held to the horizon's end at the "
         f"plan's price) and renting on demand where a month's need is short-lived costs **{_usd(g.usd_total)}** over "
         f"the {g.months} months ({_usd(g.usd_per_hour)}/h on average, {_usd_tok(g.usd_per_mtok)} per million tokens "
         f"at each month's peak demand); reserving the peak month's fleet from the first month costs "
         f"{_usd(g.peak_reserved_usd_total)} ({saving:.1%} more saved by growing). The pools above are the peak month's. "
         f"Every month's fleet is re-checked by the performance model alone ({g.status}, {g.wall_s:.1f} s).", "",
         "### What to reserve and rent, month by month", ""]
    for p in plan.months:
        buy = [f"{u.bought} x {u.hardware}" for u in p.units if u.bought]
        rent = [f"{u.on_demand} x {u.hardware}" for u in p.units if u.on_demand]
        if buy or rent:
            order = ""
            if buy and lead and p.period > 0:
                order = f" (order {lead:g} days ahead)"
            L.append(f"- Month {p.period + 1}: " + "; ".join(
                (["reserve " + ", ".join(buy) + order] if buy else [])
                + (["rent on demand " + ", ".join(rent)] if rent else [])))
    L += ["", "| month | requests/s | capacity req/s | units (held + on-demand) | reserved this month | $/h | re-check |",
          "|---:|---|---|---|---|---:|---|"]
    for p in plan.months:
        req = ", ".join(f"{w} {v:g}" for w, v in p.requests_per_s.items())
        cap = ", ".join(f"{w} {v:,.1f}" for w, v in p.capacity_rps.items())
        units = "; ".join(f"{u.hardware} {u.reserved}+{u.on_demand}" for u in p.units) or "none"
        new = "; ".join(f"{u.hardware} {u.bought}" for u in p.units if u.bought) or "-"
        L.append(f"| {p.period + 1} | {req} | {cap} | {units} | {new} | {_usd(p.usd_per_hour)} | "
                 f"{'ok' if p.recheck_ok else 'FAILED'} |")
    return L


def _cost(plan: Plan) -> list[str]:
    """Cost per token, over the day and at the peak."""
    L: list[str] = []
    o = plan.objective
    L += ["", "## Cost per token", ""]
    if plan.day is not None:
        d = plan.day
        L.append(f"- Over the day: {_usd(d.usd_per_day)} for {d.tokens_per_day / 1e6:,.1f}M tokens "
                 f"({d.output_tokens_per_day / 1e6:,.1f}M output): {_usd_tok(d.usd_per_mtok)} per million tokens, "
                 f"{_usd_tok(d.usd_per_mtok_output)} per million output tokens.")
    L.append(
        ("- At the peak period (the pools above): " if plan.day is not None else "- ")
        + f"{_usd_tok(o.usd_per_mtok)} per million tokens overall; {_usd_tok(o.usd_per_mtok_input)} per million input tokens, "
        f"{_usd_tok(o.usd_per_mtok_output)} per million output tokens."
    )
    return L


def _binding(plan: Plan) -> list[str]:
    """The binding constraints with what relaxing each is worth, and the runner-up."""
    L: list[str] = []
    o = plan.objective
    L += ["", "## What binds, and what relaxing it is worth", ""]
    if plan.binding_constraints:
        for b in plan.binding_constraints:
            L.append(f"- `{b.name}`: {b.detail}")
    else:
        L.append("- (analysis not run)")
    L += ["", "## Runner-up", ""]
    if plan.runner_up is None:
        L.append("- (not computed)")
    elif plan.runner_up.usd_per_hour is None:
        L.append(f"- Without {plan.runner_up.excluded}: {plan.runner_up.summary}.")
    else:
        r = plan.runner_up
        more = r.usd_per_hour - o.usd_per_hour
        L.append(
            f"- Without {r.excluded}: {_usd(r.usd_per_hour)}/h ({_usd_tok(r.usd_per_mtok)} per million tokens, "
            f"{_usd(more)}/h or {more / o.usd_per_hour:.1%} more): {r.summary}."
        )
        if r.status != "optimal":
            floor = r.usd_per_hour_floor
            far = ""
            if floor is not None and r.usd_per_hour is not None and r.usd_per_hour > 1.5 * floor:
                far = (f" The plan found costs {r.usd_per_hour / floor:,.1f}x that: the search ran out of time far from "
                       "the cheapest, so its $/h says little about the hardware; raise --time-limit for a real runner-up.")
            L.append("- Not proven the cheapest without it: the best plan found within the analysis's time limit"
                     + (f"; the cheapest costs at least {_usd(floor)}/h." if floor is not None else ".") + far)
    return L


def _appendix(plan: Plan) -> list[str]:
    """Placement, assumptions, sources, the re-check and the solver."""
    L: list[str] = []
    sc = plan.scenario
    L += ["", "## Placement (replicas in purchase units)", ""]
    L += _placement_lines(plan)
    L += ["", "## Assumptions", ""]
    L += [f"- {a}" for a in plan.assumptions]
    L += ["", "## Sources", ""]
    for s in plan.sources:
        if s["kind"] == "model":
            L.append(f"- model {s['id']}: {s['source']} (as of {s['as_of']})")
        elif s["kind"] == "engine":
            if any(p.engine == s["id"] for p in plan.pools):
                L.append(f"- engine {s['id']}: {s['source'].strip()} (as of {s['as_of']})")
        else:
            L.append(
                f"- {s['id']}: ${s['usd_per_chip_hour']:.2f}/chip-hour ({s['price_source']}); datasheet: {s['source']} "
                f"(as of {s['as_of']}); efficiency: {s['efficiency_source']}"
            )
    L += ["", "## Re-check", ""]
    if plan.recheck is not None:
        bad = [c for c in plan.recheck.checks if not c.ok]
        L.append(
            f"- {len(plan.recheck.checks)} checks by the performance model alone: "
            + ("all pass." if not bad else f"{len(bad)} FAIL: " + "; ".join(f"{c.name} ({c.detail})" for c in bad))
        )
    s = plan.solver
    L += [
        "",
        "## Solver",
        "",
        f"- status {s.status}, termination {s.termination}, MIP gap {f'{s.mip_gap:.2g}' if s.mip_gap is not None else 'n/a'} "
        f"(target {s.mip_gap_target:g}), solve {s.wall_s:.2f} s, candidates {s.candidates_s:.2f} s, model build {s.build_s:.2f} s",
        "- candidate rows: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in s.candidates.items()),
        f"- inputs hash {sc.get('input_hash', '')[:16]}, plan schema {plan.schema_version}",
        "",
    ]
    return L


def _migration(plan: Plan) -> list[str]:
    from planner.export.migration import migration_markdown

    return migration_markdown(plan.migration) if plan.migration is not None else []


def plan_markdown(plan: Plan) -> str:
    """plan.md: the summary, then each section."""
    L: list[str] = [f"# Deployment plan: {plan.scenario['name']}", "", summary(plan), ""]
    L += _bill(plan)
    L += ["", "## Pools", ""]
    for p in plan.pools:
        L += _pool(plan, p)
    for section in (_workloads, _resilience, _periods, _months, _migration, _cost, _binding, _appendix):
        L += section(plan)
    return "\n".join(L)


def _placement_lines(plan: Plan) -> list[str]:
    """One line per run of identical units."""
    out: list[str] = []
    runs: list[list] = []
    for up in plan.placement:
        key = (up.hardware, tuple(tuple((g.pool, g.chips) for g in d) for d in up.domains))
        if runs and runs[-1][0] == key and runs[-1][2] + 1 == up.unit:
            runs[-1][2] = up.unit + up.count - 1
            continue
        runs.append([key, up.unit, up.unit + up.count - 1, up])
    for _key, a, b, up in runs:
        unit = next(g.kind for g in plan.units if g.hardware == up.hardware)
        name = f"{up.hardware} {unit} {a}" if a == b else f"{up.hardware} {unit}s {a:,}-{b:,} (each)"
        doms = []
        for d in up.domains:
            counts: dict[tuple[str, int], int] = {}
            for g in d:
                counts[(g.pool, g.chips)] = counts.get((g.pool, g.chips), 0) + 1
            doms.append(" + ".join(f"{n} x {p} group ({c} chip{'s' if c != 1 else ''})" for (p, c), n in counts.items()))
        if len(doms) == 1:
            out.append(f"- {name}: {doms[0]}")
        elif len(set(doms)) == 1:
            out.append(f"- {name}: {len(doms)} domains, each {doms[0]}")
        else:
            out.append(f"- {name}: " + " | ".join(f"domain {i + 1}: {d}" for i, d in enumerate(doms)))
    return out or ["- (empty)"]


def legacy_plan_files(folder: Path) -> set[str]:
    """Files a plan folder written before manifests holds: plan.md, plan.json and the placement maps its
    plan.json names (nothing else: a user's own files stay theirs)."""
    names = {n for n in ("plan.md", "plan.json") if (folder / n).is_file()}
    try:
        doc = json.loads((folder / "plan.json").read_text(encoding="utf-8"))
        for pool in doc.get("pools", []) if isinstance(doc, dict) else []:
            xp = pool.get("expert_placement") if isinstance(pool, dict) else None
            mf = xp.get("map_file") if isinstance(xp, dict) else None
            if isinstance(mf, str) and "/" not in mf and mf not in ("", ".", ".."):
                names.add(mf)
    except (OSError, ValueError):
        pass
    return names


def write_plan(plan: Plan, out_dir: Path, *, force: bool = False, files: dict[str, str] | None = None) -> tuple[Path, Path]:
    """Write ``plan.md``, ``plan.json`` and the plan's extra ``files`` (expert placement maps) as one unit:
    the folder is swapped in whole (see :mod:`planner.export.files`); an existing plan is replaced only
    with ``force``, and then only the files the planner wrote there."""
    with staged(out_dir, force=force, unit=True, kind="plan", legacy=legacy_plan_files) as stage:
        for name, text in (files or {}).items():
            atomic_write_text(stage / name, text)
        if plan.periods:
            from planner.catalog.writer import atomic_write_bytes
            from planner.export.plots import periods_png

            atomic_write_bytes(stage / "periods.png", periods_png(plan))
        atomic_write_text(stage / "plan.json", plan_json(plan))
        atomic_write_text(stage / "plan.md", plan_markdown(plan))
    return out_dir / "plan.md", out_dir / "plan.json"
