"""Every command an export writes, checked against its engine's target release before anything is written.

:func:`verify` builds a :class:`planner.export.checks.Command` per (pool, engine) launch command -- its flags, the
environment its script exports, TensorRT-LLM's ``--config`` YAML, the pool's facts and, for the plan's own engine,
the metric names the monitors and alerts read -- and checks each against the release's flag table and start-up
rules, then every prefill pool with each decode pool of its workload against the pair rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.catalog.loader import Catalog
from planner.catalog.releases import flag_table, rules_for, rules_path
from planner.errors import InputError
from planner.export import launch
from planner.export.checks import Command, RuleError, Violation, check_command, check_pair, parse
from planner.export.deploy import Deployment


@dataclass(frozen=True)
class Launch:
    """One generated launch: the pool, the engine it targets, its arguments and (TensorRT-LLM) its config."""

    deployment: Deployment
    target: str
    args: list[str]
    config: dict | None = None


def metric_names(d: Deployment, catalog: Catalog) -> list[str]:
    """The engine metrics the export's monitors, alerts and autoscalers read for a pool of the plan's engine."""
    eng = catalog.get_engine(d.engine)
    if eng.metrics is None:
        return []
    return [m for m in (eng.metrics.ttft_histogram, eng.metrics.tpot_histogram, eng.metrics.running_requests) if m]


def command_of(item: Launch, catalog: Catalog) -> Command:
    d = item.deployment
    return Command(pool=d.pool, engine=item.target, argv=list(item.args), env=launch.environment(d, item.target),
                   facts=launch.facts(d), config=dict(item.config or {}),
                   metrics=metric_names(d, catalog) if item.target == d.engine else [])


def verify(items: list[Launch], catalog: Catalog) -> list[Violation]:
    """Findings over every launch and every prefill/decode pairing of the plan's own engines; a rule outside the
    language is an :class:`InputError` naming the rules file and the rule."""
    try:
        return _verify(items, catalog)
    except RuleError as e:
        path = rules_path(catalog, catalog.get_engine(items[0].target)) if items else "rules.yaml"
        raise InputError(f"{path}: {e}") from None


def _verify(items: list[Launch], catalog: Catalog) -> list[Violation]:
    out: list[Violation] = []
    rules: dict[str, list] = {}
    own: dict[str, Command] = {}
    for item in items:
        eng = catalog.get_engine(item.target)
        if item.target not in rules:
            rules[item.target] = rules_for(catalog, eng)
        cmd = command_of(item, catalog)
        out += check_command(cmd, flag_table(catalog, eng), rules[item.target])
        if item.target == item.deployment.engine:
            own[item.deployment.pool] = cmd
    deps = {i.deployment.pool: i.deployment for i in items}
    for p in (d for d in deps.values() if d.role == "prefill" and d.pool in own):
        for q in (d for d in deps.values() if d.role == "decode" and d.workload == p.workload and d.pool in own):
            for cmd in (own[p.pool], own[q.pool]):
                if not cmd.values:
                    parse(cmd, flag_table(catalog, catalog.get_engine(cmd.engine)))
            for engine in {p.engine, q.engine} - set(rules):
                rules[engine] = rules_for(catalog, catalog.get_engine(engine))
            out += check_pair(own[p.pool], own[q.pool], rules)
    return out


def router_findings(objs: list[dict], engine: str, catalog: Catalog, workload: str) -> list[Violation]:
    """A generated PD router's command line against its package's flag table (where the catalog has one)."""
    table = flag_table(catalog, catalog.get_engine(engine), router=True)
    out: list[Violation] = []
    if table is None:
        return out
    for o in objs:
        if o.get("kind") != "Deployment":
            continue
        for c in o["spec"]["template"]["spec"]["containers"]:
            cmd = Command(pool=f"{workload} router", engine=f"{engine}-router", argv=list(c.get("args", [])))
            out += parse(cmd, table)
    return out


def refuse(violations: list[Violation]) -> None:
    """One line for the first finding (and how many more): the export writes nothing."""
    if violations:
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise InputError(f"export refused: {violations[0].line()}{more}; nothing written")
