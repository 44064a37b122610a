"""Lifetime economics (``planner lifetime``): how big a model to train, and on how many tokens, when its serving
costs what the planner says it costs.

For a loss target (a scaling law's loss, or that of a reference model's published ``N`` and ``D``), each model
size ``N`` of a family (:mod:`planner.studies.family`) needs ``D(N)`` training tokens (:mod:`planner.studies.scaling`,
repeated data priced where unique tokens are limited). Training costs ``6 N D`` FLOPs at the training hardware's
bf16 peak times ``mfu``, at its price. Serving a lifetime volume (tokens per day over ``life_days``, the traffic
scenario's workload mix and SLOs scaled to that volume) costs the planner's own cheapest plan for the generated
model: its $/h times the life's hours. The optimum is taken over a grid of sizes from the compute-optimal ``N`` (no
serving volume: more volume never asks for a larger model) down to where training runs ``OVERTRAIN_MAX`` times past
the compute-optimal tokens; each size's candidates are evaluated once and its plan re-solved per volume.

A sparse (MoE) family is priced at its effective parameters (:func:`planner.studies.scaling.effective_params`): the
grid is over effective sizes, each generated at the total that gives it (the family's experts and top-k, or
``experts`` of them), trained at ``6 N_active D``.

Beside it, the published analyses' assumption (Sardana and Frankle 2024): inference at ``2 N`` FLOPs per token at a
fixed utilisation of the serving hardware's peak, priced at its price: what that says the optimum is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from planner.analysis.context import fleet_cost
from planner.catalog.scenario import ResolvedScenario, resolve_scenario
from planner.errors import InfeasibleError, InputError, PlannerError
from planner.model import build_model, prepare
from planner.model.bounds import greedy_start, solve_from
from planner.model.data import drop_unpowered
from planner.options import DEFAULT_MIP_GAP
from planner.perf.candidates import evaluate_candidates, prefix_shares, scenario_slos, select_candidates
from planner.perf.params import model_stats
from planner.pipeline.diagnose import diagnose_candidates
from planner.solve import Solver
from planner.studies.family import FAMILY_MEMBERS, SPARSE_FAMILIES, generate
from planner.studies.scaling import LAWS, SPARSE_EXPONENT, effective_params, tokens_with_repeats
from planner.units import HOUR_S

GRID_POINTS = 14
MAX_JOBS = 4
OVERTRAIN_MAX = 3000.0
"""Smallest model of the grid: the size whose tokens are this many times its compute-optimal tokens."""
NAIVE_UTILISATION = 0.5
"""Serving utilisation of the hardware's bf16 peak the ``2 N`` FLOPs-per-token comparison assumes."""


@dataclass
class LifetimeInputs:
    family: str
    law: str
    loss: float
    volumes: list[float]
    """Lifetime serving volumes, tokens per day (input and output)."""
    life_days: float
    train_hardware: str
    mfu: float
    train_usd_per_chip_hour: float | None = None
    unique_tokens: float | None = None
    naive_utilisation: float = NAIVE_UTILISATION
    experts: int | None = None
    """Routed experts of a sparse family's models (default: the nearest member's; top-k kept)."""
    sparse_exponent: float = SPARSE_EXPONENT

    @property
    def sparse(self) -> bool:
        return self.family in SPARSE_FAMILIES

    def check(self) -> None:
        if self.family not in FAMILY_MEMBERS:
            raise InputError(f"--family: '{self.family}' is not known; use {', '.join(FAMILY_MEMBERS)}")
        if self.experts is not None and (not self.sparse or self.experts < 2):
            raise InputError(f"--experts: {self.experts} needs a sparse family ({', '.join(SPARSE_FAMILIES)}) and at "
                             "least 2 experts")
        if not 0 <= self.sparse_exponent <= 1:
            raise InputError(f"--sparse-exponent: {self.sparse_exponent:g} must be in [0, 1]")
        if self.law not in LAWS:
            raise InputError(f"--law: '{self.law}' is not known; use {', '.join(LAWS)}")
        LAWS[self.law].check(self.loss)
        if not 0 < self.mfu <= 1:
            raise InputError(f"--mfu: {self.mfu:g} must be in (0, 1]")
        if any(v < 0 or not math.isfinite(v) for v in self.volumes):
            raise InputError("--volumes: a volume is negative or not finite (tokens per day, 0 or more)")
        if self.life_days <= 0:
            raise InputError(f"--life-days: {self.life_days:g} must be positive")
        if self.train_usd_per_chip_hour is not None and not (0 < self.train_usd_per_chip_hour < math.inf):
            raise InputError(f"--train-price: {self.train_usd_per_chip_hour:g} must be a positive USD per chip-hour")
        if self.unique_tokens is not None and self.unique_tokens <= 0:
            raise InputError(f"--unique-tokens: {self.unique_tokens:g} must be positive")


@dataclass
class SizePoint:
    """One model size of the grid: the generated model and its training (``params`` its total, ``effective``
    what the scaling law sees: the total for a dense model)."""
    target_params: float
    params: float
    model_id: str
    tokens: float
    optimal_tokens: float
    train_usd: float
    serve_usd_per_hour: dict[float, float | None] = field(default_factory=dict)
    """Per volume (tokens/day): the plan's $/h (``None``: no plan serves it)."""
    note: str = ""
    active: float = 0.0
    effective: float = 0.0


@dataclass
class Choice:
    volume: float
    point: SizePoint | None
    serve_usd: float
    naive_point: SizePoint | None
    naive_serve_usd: float

    @property
    def total_usd(self) -> float:
        return (self.point.train_usd + self.serve_usd) if self.point else math.inf


def train_usd(inputs: LifetimeInputs, catalog, active_params: float, tokens: float) -> float:
    hw = catalog.get_hardware(inputs.train_hardware)
    price = inputs.train_usd_per_chip_hour if inputs.train_usd_per_chip_hour is not None else hw.price_usd_per_chip_hour
    if price is None:
        raise InputError(f"--train-price: {hw.id} has no catalog price; give one in USD per chip-hour")
    chip_s = 6.0 * active_params * tokens / (hw.flops("bf16") * inputs.mfu)
    return chip_s / HOUR_S * price


def grid(inputs: LifetimeInputs) -> list[float]:
    """Model sizes from the compute-optimal one down to ``OVERTRAIN_MAX`` past it (log-spaced)."""
    from planner.studies.family import MAX_PARAMS

    law = LAWS[inputs.law]
    n_opt, _ = law.compute_optimal(inputs.loss)
    if n_opt > MAX_PARAMS:
        raise InputError(f"--loss: {inputs.loss:g} needs a compute-optimal model of {n_opt:.3g} parameters, beyond the "
                         f"{MAX_PARAMS:.0e} the family generator shapes; give a higher loss")
    lo = n_opt
    while True:
        nxt = lo / 1.05
        d = law.tokens_for(nxt, inputs.loss)
        if d is None or d / law.optimal_tokens(nxt) > OVERTRAIN_MAX:
            break
        lo = nxt
    return sorted({float(x) for x in np.geomspace(lo, n_opt, GRID_POINTS)}, reverse=True)


def scaled(rs_sc, volume: float):
    """The traffic scenario's workloads scaled so that they carry ``volume`` tokens a day."""
    sc = rs_sc
    day = sum(w.requests_per_s * (w.input_tokens + w.output_tokens) for w in sc.workloads) * 86400.0
    f = volume / day
    return sc.model_copy(update={"workloads": [w.model_copy(update={"requests_per_s": w.requests_per_s * f})
                                               for w in sc.workloads]})


def family_model(inputs: LifetimeInputs, catalog, effective: float):
    """The family's model whose effective parameters are ``effective`` (a dense model: its total); a sparse one
    is generated at a guessed total, then at the total corrected by what the guess gave (at fixed experts and
    top-k the active share is nearly fixed, so the effective size is nearly proportional to the total)."""
    if not inputs.sparse:
        return generate(catalog, inputs.family, effective)
    total = effective
    for _ in range(4):
        model = generate(catalog, inputs.family, total, experts=inputs.experts)
        st = model_stats(model)
        got = effective_params(st.total_params, st.active_params, inputs.sparse_exponent)
        if abs(got / effective - 1) < 0.01:
            break
        total *= effective / got
    return model


def size_point(inputs: LifetimeInputs, catalog, target: float) -> tuple[SizePoint, object]:
    law = LAWS[inputs.law]
    try:
        model = family_model(inputs, catalog, target)
    except InputError as e:
        return SizePoint(target, math.inf, "", math.inf, math.inf, math.inf, note=str(e)), None
    st = model_stats(model)
    eff = effective_params(st.total_params, st.active_params, inputs.sparse_exponent) if inputs.sparse else st.total_params

    def point(tokens: float, train: float, note: str = "") -> SizePoint:
        return SizePoint(target, st.total_params, model.id, tokens, law.optimal_tokens(eff), train, note=note,
                         active=st.active_params, effective=eff)

    need = law.tokens_for(eff, inputs.loss)
    if need is None:
        return point(math.inf, math.inf, "cannot reach the loss"), model
    try:
        d = tokens_with_repeats(need, inputs.unique_tokens)
    except InfeasibleError as e:
        return point(math.inf, math.inf, str(e)), model
    note = f"{d / inputs.unique_tokens:.1f} epochs of the unique tokens" if d > need * (1 + 1e-9) else ""
    return point(d, train_usd(inputs, catalog, st.active_params, d), note), model


def serving_costs(rs: ResolvedScenario, catalog, model, volumes: list[float],
                  time_limit_s: float = 60.0) -> tuple[dict[float, float | None], str]:
    """The planner's cheapest $/h for ``model`` serving the traffic scenario at each volume (tokens/day; ``None``:
    no plan) and, where there is none at any volume, why: the candidates evaluated once, the plan's MILP solved
    per volume (the same rows ``planner plan`` would keep)."""
    cat = replace(catalog, models={**catalog.models, model.id: model})
    sc = rs.scenario.model_copy(update={"model": model.id, "workloads": [w.model_copy(update={"model": None})
                                                                          for w in rs.scenario.workloads]})
    live = [v for v in volumes if v > 0]
    out: dict[float, float | None] = {v: 0.0 for v in volumes if v <= 0}
    if not live:
        return out, ""
    scens = {v: scaled(sc, v) for v in live}
    shares = {}
    for v in live:
        for w, (lo, hi) in prefix_shares(scens[v].workloads).items():
            a, b = shares.get(w, (math.inf, 0.0))
            shares[w] = (min(a, lo), max(b, hi))
    try:
        base, _ = drop_unpowered(resolve_scenario(scens[live[-1]], cat, rs.path))
        pool = evaluate_candidates(base, None, [scenario_slos(base.scenario.workloads)], shares)
        table = select_candidates(pool, scenario_slos(base.scenario.workloads))  # the volumes' SLOs, so rows
        diagnose_candidates(base, pool, table)
    except PlannerError as err:
        return {**out, **{v: None for v in live}}, str(err)
    for v in live:
        rs_v = replace(base, scenario=scens[v])
        m = build_model(prepare(rs_v, table))
        # as `planner plan` solves: from the greedy plan, its cost capping the units (model.bounds)
        r = solve_from(Solver(time_limit_s=time_limit_s, mip_gap=DEFAULT_MIP_GAP), m, greedy_start(m, check=False))
        out[v] = fleet_cost(m, m._data) if r.has_solution else None
    return out, ""


def naive_serve_usd(inputs: LifetimeInputs, catalog, rs: ResolvedScenario, active_params: float, volume: float) -> float:
    """Serving at ``2 N`` FLOPs per token at ``naive_utilisation`` of the cheapest-per-FLOP candidate hardware's
    bf16 peak, over the life."""
    best = min(h.price_usd_per_chip_hour / h.flops("bf16") for h in rs.hardware if h.price_usd_per_chip_hour)
    return 2.0 * active_params * volume * inputs.life_days / inputs.naive_utilisation * best / HOUR_S


def _size(args) -> SizePoint:
    inputs, rs, catalog, target = args
    p, model = size_point(inputs, catalog, target)
    if math.isfinite(p.train_usd) and model is not None:
        p.serve_usd_per_hour, why = serving_costs(rs, catalog, model, inputs.volumes)
        p.note = p.note or why
    return p


def _sizes(inputs: LifetimeInputs, rs: ResolvedScenario, catalog, sizes: list[float], jobs: int | None,
           progress) -> list[SizePoint]:
    """Each size's point, its plans re-solved per volume; sizes are independent, so ``jobs`` processes (default:
    one per core, at most ``MAX_JOBS``) share them."""
    import os

    n = jobs or min(MAX_JOBS, os.cpu_count() or 1)
    work = [(inputs, rs, catalog, s) for s in sizes]
    if n <= 1 or len(sizes) < 2:
        out = []
        for k, w in enumerate(work):
            progress(f"size {k + 1} of {len(sizes)}: {w[3] / 1e9:,.1f}B parameters")
            out.append(_size(w))
        return out
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    progress(f"{len(sizes)} sizes on {n} processes")
    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
        return list(ex.map(_size, work))


def lifetime(inputs: LifetimeInputs, rs: ResolvedScenario, catalog, progress=lambda _m: None,
             jobs: int | None = None) -> tuple[list[SizePoint], list[Choice]]:
    """Every size of the grid with its training and serving costs per volume, and the cheapest per volume (and
    the cheapest under the ``2 N`` FLOPs assumption)."""
    inputs.check()
    sizes = grid(inputs)
    points = _sizes(inputs, rs, catalog, sizes, jobs, progress)
    hours = inputs.life_days * 24.0
    choices = []
    for v in inputs.volumes:
        ok = [p for p in points if math.isfinite(p.train_usd) and p.serve_usd_per_hour.get(v) is not None]
        best = min(ok, key=lambda p: p.train_usd + p.serve_usd_per_hour[v] * hours, default=None)
        if best is not None and best is points[-1] and v > 0:
            best = replace(best, note=(best.note + "; " if best.note else "") + "the smallest size of the grid "
                           f"({OVERTRAIN_MAX:g}x past the compute-optimal tokens): a smaller model may be cheaper")
        naive = min(((naive_serve_usd(inputs, catalog, rs, p.active, v), p) for p in points
                     if math.isfinite(p.train_usd)), key=lambda sp: sp[1].train_usd + sp[0], default=(math.inf, None))
        choices.append(Choice(v, best, best.serve_usd_per_hour[v] * hours if best else math.inf, naive[1], naive[0]))
    if all(c.point is None for c in choices if c.volume > 0) and any(v > 0 for v in inputs.volumes):
        why = next((p.note for p in reversed(points) if p.note), "memory or SLOs")
        raise InfeasibleError(f"no size of the {inputs.family} family between {min(sizes) / 1e9:,.1f}B and "
                              f"{max(sizes) / 1e9:,.1f}B parameters can be served on the scenario's hardware "
                              f"(the smallest: {why}); allow larger hardware, or a looser loss target")
    return points, choices


VARIANTS = (
    ("as given", None),
    ("faster tier: TPOT and TTFT targets halved", "fast"),
    ("8-GPU NVLink nodes (b200-sxm)", "b200-sxm"),
    ("72-GPU NVLink racks (gb200-nvl72)", "gb200-nvl72"),
)
"""How the answer moves: the scenario as given, a faster serving tier, and one Blackwell generation on a small and
on a large scale-up domain (the same chips: only the domain differs)."""


def variant_scenario(rs: ResolvedScenario, catalog, kind: str | None) -> ResolvedScenario:
    sc = rs.scenario
    if kind is None:
        return rs
    if kind == "fast":
        wls = [w.model_copy(update={"slo": w.slo.model_copy(update={"ttft_ms": w.slo.ttft_ms / 2,
                                                                       "tpot_ms": w.slo.tpot_ms / 2})})
               for w in sc.workloads]
        return resolve_scenario(sc.model_copy(update={"workloads": wls}), catalog, rs.path)
    return resolve_scenario(sc.model_copy(update={"hardware": [kind], "limits": sc.limits.model_copy(
        update={"max_units": {}})}), catalog, rs.path)


EXPERT_VARIANTS = (32, 512)
"""Sparsity variants of a sparse family: its top-k over this many routed experts (denser and sparser than the
members' 128)."""


def variants(inputs: LifetimeInputs, rs: ResolvedScenario, catalog, progress=lambda _m: None,
             jobs: int | None = None, given: list[Choice] | None = None) -> list[tuple[str, list[Choice]]]:
    """The optimum per volume under each of :data:`VARIANTS` and, for a sparse family, each of
    :data:`EXPERT_VARIANTS` (a variant no size can be served in is left out; ``given``: the sweep as given,
    already run)."""
    runs = [(label, inputs, variant_scenario(rs, catalog, kind)) for label, kind in VARIANTS
            if kind is not None or given is None]
    if inputs.sparse:
        runs += [(f"sparsity: top-k of {e} experts", replace(inputs, experts=e), rs) for e in EXPERT_VARIANTS]
    out = []
    for label, inp, sc in runs:
        progress(f"variant: {label}")
        try:
            _, choices = lifetime(inp, sc, catalog, progress, jobs)
        except InfeasibleError:
            continue
        out.append((label, choices))
    return ([(VARIANTS[0][0], given)] if given is not None else []) + out


@dataclass
class LifetimeRun:
    """One family's sweep: its sizes, the optimum per volume and, where asked, how it moves."""
    inputs: LifetimeInputs
    points: list[SizePoint]
    choices: list[Choice]
    variants: list[tuple[str, list[Choice]]] = field(default_factory=list)


def run_families(inputs: list[LifetimeInputs], rs: ResolvedScenario, catalog, *, with_variants: bool = False,
                 progress=lambda _m: None, jobs: int | None = None) -> list[LifetimeRun]:
    """The sweep of each family (``planner lifetime`` and the lifetime section of ``planner insights``)."""
    out = []
    for inp in inputs:
        progress(f"family {inp.family}")
        points, choices = lifetime(inp, rs, catalog, progress, jobs)
        found = variants(inp, rs, catalog, progress, jobs, given=choices) if with_variants else []
        out.append(LifetimeRun(inp, points, choices, found))
    return out


INSIGHTS_FAMILIES = ("llama3", "qwen3-moe")


def insights_runs(rs: ResolvedScenario, catalog, reference: tuple[float, float], volumes: list[float],
                  progress=lambda _m: None) -> list[LifetimeRun]:
    """The lifetime section of ``planner insights``: a dense and a MoE family at the loss of a reference model
    (``N, D`` under the Epoch law), trained on H100s at 40% MFU, served for a year, with every variant."""
    loss = LAWS["epoch"].loss(*reference)
    inputs = [LifetimeInputs(f, "epoch", loss, volumes, 365.0, "h100-sxm", 0.4) for f in INSIGHTS_FAMILIES]
    for i in inputs:
        i.check()
    return run_families(inputs, rs, catalog, with_variants=True, progress=progress)
