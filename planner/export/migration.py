"""The migration as Markdown: plan.md's section for a plan made from a deployed fleet, the runbook's order of
changes and ``planner diff``'s output."""

from __future__ import annotations

from planner.results.migration import Migration, PoolChange, Step, UnitChange


def _usd(x: float) -> str:
    return f"${x:,.2f}"


def diff_lines(units: list[UnitChange], pools: list[PoolChange]) -> list[str]:
    """The diff: units per hardware before and after, pools with their replicas before and after."""
    L = ["| hardware | units before | units after | added | released |", "|---|---:|---:|---:|---:|"]
    for u in units:
        L.append(f"| {u.hardware} | {u.before} | {u.after} | {u.added} | {u.released} |")
    L += ["", "| pool | workload | role | hardware | engine | layout | weights | change | replicas before | replicas after |",
          "|---|---|---|---|---|---|---|---|---:|---:|"]
    for c in pools:
        name = c.pool or c.old_pool or "-"
        if c.old_pool and c.pool and c.old_pool != c.pool:
            name = f"{c.pool} (was {c.old_pool})"
        L.append(f"| {name} | {c.workload} | {c.role} | {c.hardware} | {c.engine} | {c.layout} | {c.weights_dtype or 'any'} | "
                 f"{c.status} | {c.replicas_before} | {c.replicas_after} |")
    return L


def step_lines(steps: list[Step]) -> list[str]:
    """The ordered steps with the units held, their $/h and each workload's capacity against its demand."""
    L = ["| step | action | what | units held | $/h | capacity / demand (req/s) | ok |", "|---:|---|---|---|---:|---|---|"]
    for s in steps:
        units = ", ".join(f"{n} {h}" for h, n in sorted(s.units.items()))
        cap = "; ".join(f"{w} {s.capacity_rps[w]:,.1f} / {d:,.1f}" if w in s.capacity_rps else f"{w} ? / {d:,.1f}"
                        for w, d in sorted(s.demand_rps.items()))
        L.append(f"| {s.step} | {s.action} | {s.detail} | {units} | {_usd(s.usd_per_hour)} | {cap} | "
                 f"{'yes' if s.ok else '**no**'} |")
    return L


def migration_markdown(m: Migration) -> list[str]:
    """plan.md's section: where the plan starts from, what it costs over the horizon against the alternatives,
    the diff and the steps."""
    L = ["", f"## Migration from the deployed fleet ({m.source})", ""]
    c = m.cost
    if c is not None:
        hours = c.total_usd / c.usd_per_hour if c.usd_per_hour else 0.0
        L += [f"Over {c.horizon_months:g} months from {m.start}: {_usd(c.total_usd)} ({_usd(c.usd_per_hour)}/h: the fleet "
              f"{_usd(c.run_rate_usd_per_hour)}/h once changed, of which {_usd(c.committed_usd_per_hour)}/h is committed "
              f"whatever is released, and {_usd(c.change_usd)} of changes spread over {hours:,.0f} hours).", ""]
        alt = []
        alt.append(f"keeping the deployed units as they are: {_usd(c.keep_usd)}" if c.keep_usd is not None else
                   "keeping the deployed units as they are: cannot serve the demand")
        if c.scratch_usd is not None:
            alt.append(f"the from-scratch plan ({_usd(c.scratch_usd_per_hour or 0.0)}/h at the plan's prices) with its "
                       f"change cost: {_usd(c.scratch_usd)}")
        L += ["Against: " + "; ".join(alt) + ".", ""]
    if m.lead_time_days:
        L += [f"Added hardware takes {m.lead_time_days:g} days to arrive.", ""]
    L += ["### What changes", ""] + diff_lines(m.units, m.pools)
    L += ["", "### Steps (add before remove; capacity never below demand)", ""] + step_lines(m.steps)
    if m.notes:
        L += [""] + [f"- {n}" for n in m.notes]
    return L


def runbook_lines(m: Migration) -> list[str]:
    """The runbook's order of changes: the steps in words."""
    L = ["## Migrating from the deployed fleet", "",
         f"The plan changes the fleet deployed from `{m.source}`; apply it in this order (each step only once the one "
         "before is healthy). The manifests hold the full new state: kept pools keep their names, so a declarative "
         "apply updates them in place; `migration.json` holds the diff.", ""]
    for s in m.steps:
        flag = "" if s.ok else " **(capacity below demand: see the notes)**"
        L.append(f"{s.step}. **{s.action}**: {s.detail} (then {_usd(s.usd_per_hour)}/h){flag}")
    L += [""] + [f"- {n}" for n in m.notes] + ([""] if m.notes else [])
    return L
