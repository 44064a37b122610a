"""Fit the ``efficiency`` factors of the hardware catalog to measured TTFT/TPOT rows.

Method (re-run with ``planner calibrate fit --data FILE --write``):

1. Normalise the rows (``calib.data``); rows that cannot be predicted, disaggregated rows that do not record
   their prefill/decode worker counts and concurrency sweeps not measured in a steady state
   (:func:`planner.calib.checks.inconsistent_sweeps`) are left out of the fit and counted.
2. TPOT factors (``TPOT_PARAMS``) are fitted first, then the TTFT factors (``TTFT_PARAMS``) with the
   TPOT ones held, on TTFT and TPOT residuals together (prefill capacity sets the decode batch of a
   disaggregated pool), and the two stages alternate ``ROUNDS`` times, more while the loss still falls. A factor
   that fewer than ``MIN_ROWS`` rows of a group respond to (``INFORM_DELTA``) keeps its prior. The loss is a
   robust (soft-L1) loss on ``log(predicted / measured)``, so a factor of 2 too high and too low
   weigh the same and outliers do not dominate.
3. Per serving engine over all hardware (the engine prior); per hardware over all its engines (its
   ``default``); then per hardware and engine where at least ``MIN_ROWS`` rows exist, shrunk toward a prior
   that takes the kernel and link factors (``HARDWARE_FACTORS``) from the hardware's fit and the rest from the
   engine's, by a penalty on the log of each factor's ratio to the prior. A pair keeps at most ``PAIR_FREE`` (8)
   factors of its own (:func:`fit_pair`): those that, refitted, leave the least loss with the others back at the
   prior (:mod:`planner.calib.profile`); the rest are the prior's, shared with the hardware's other engines or the
   engine's other hardware.
4. The first wave's one-time delay of benchmark runs (``first_wave_s``, :mod:`planner.calib.wave`), per engine and
   hardware vendor (the kernel stack) over every such hardware's p99 TTFT, after the rest (no median depends on it).
5. Hardware without measured rows gets the factors of its nearest measured relative (same vendor
   and generation) or the all-data fit, recorded as transferred with ``fitted_rows: 0``. Hardware with a few rows,
   fewer than ``MIN_ROWS``, is transferred too, with its per-step cost and prefill rate anchored on those rows
   (:mod:`planner.calib.anchor`), which enter no other fit.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from planner.calib import silicon as S
from planner.calib.anchor import anchored, few_row_hardware
from planner.calib.checks import unsteady
from planner.calib.consistency import overruled_curves, update_kernels, with_overruled
from planner.calib.predict import log_residuals as _residuals
from planner.calib.profile import keep_by_profile
from planner.calib.wave import F_SCALE, fit_first_wave, set_vendor_delays
from planner.catalog import Catalog, Efficiency, EngineEfficiency
from planner.errors import InputError
from planner.perf.roofline import FORMAT_FACTOR, factor_dtype

log = logging.getLogger(__name__)

MIN_ROWS = 25
ROUNDS = 2
"""Alternations of the TPOT and TTFT stages (:func:`fit_group`) at least."""
MAX_ROUNDS = 6
"""Alternations at most: after :data:`ROUNDS`, another follows while the last cut the rows' loss by more than
:data:`CONVERGED` (a group whose TPOT and TTFT factors trade against each other, as GB200 TensorRT-LLM's
``memory``, ``seq_overhead_us`` and ``prefill_compute`` do, is still moving after two)."""
CONVERGED = 0.01
"""Relative cut of the loss below which another alternation is not worth its time (:data:`MAX_ROUNDS`)."""
INFORM_DELTA = 0.02
"""A row informs a factor when doubling the factor moves its prediction by more than 2%."""
HARDWARE_FACTORS = ("compute", "compute_fp8", "compute_fp4", "gemm_half_tokens", "attention_compute", "memory",
                    "prefill_compute", "prefill_comm_bandwidth")
"""Factors of the kernels and links on a hardware: a (hardware, engine) group whose rows do not pin one keeps the
hardware's own fit (over all its engines), not the engine's fit over other vendors' chips."""
PHYSICS_PRIOR = {
    "compute": 0.6, "compute_fp8": 0.6, "compute_fp4": 0.5, "attention_compute": 0.5, "prefill_compute": 0.35,
    "memory": 0.85, "interference": 1.0, "spec_accept_scale": 1.0, "kernel_fixed_share": 0.7,
}
"""Physical expectations of the utilisation factors, which every fit is pulled toward (a maximum a posteriori
fit): large GEMMs reach 60-80% of tensor peak in vendor libraries (DeepGEMM FP8 ~1,550 of 1,979 TFLOP/s on
H800), FP4 a little less; a decode step streams HBM at ~80-90% (AIConfigurator's empirical scaling 0.8);
production prefill runs at ~16-26% of FP8 peak all in (DeepSeek, LMSYS), the compute part alone about a third;
interleaved prompt tokens cost what their FLOPs cost (1); drafts are accepted at the model's published rate (1).
Without it, benchmark rows dominated by engine overheads let a factor wander where no row pins it, and plans at
production batch sizes inherit the wandering."""
OVERHEAD_PRIOR = {"seq_overhead_us": (2.0, 5.0)}
"""Physical prior (mean, spread in us) of the per-sequence cost of a step where the step is composed from kernel
curves: an engine's per-request work on the GPU (sampling, logits processing, metadata) is a few microseconds a
sequence, and its CPU scheduling overlaps the previous step. Without it the fit moves batch-dependent costs the
curves miss into this term (20-77 us a sequence: 55% of a 1,408-sequence wide-EP step)."""
OVERHEAD_WEIGHT = 0.2
"""Pull toward :data:`OVERHEAD_PRIOR`: one spread away costs ``OVERHEAD_WEIGHT * sqrt(rows)`` residual units."""
PHYSICS_WEIGHT = 0.05
"""Pull toward :data:`PHYSICS_PRIOR`: a factor of 2 away costs ``PHYSICS_WEIGHT * sqrt(rows)`` residual units."""
PAIR_FREE = 8
"""End-to-end factors fitted on one (hardware, engine) group's own rows at most (issue 42); the rest are shared:
the hardware's silicon and link factors (:data:`HARDWARE_FACTORS`, its fit over all its engines) and the engine's
(its fit over all hardware)."""
SHRINK = 0.15
"""Weight of the pull toward the engine prior, per factor, in log units (about one row's worth x 0.15 sqrt(n))."""

TPOT_PARAMS = (
    "compute", "compute_fp8", "compute_fp4", "gemm_half_tokens", "attention_compute", "spec_accept_scale",
    "draft_overhead_us", "memory", "step_overhead_us", "layer_overhead_us", "moe_layer_overhead_us", "seq_overhead_us", "collective_latency_us",
    "scale_out_latency_us", "comm_overlap", "interference",
)
KERNEL_TPOT_PARAMS = ("kernel_fixed_share", "layer_overhead_us", "seq_overhead_us", "comm_overlap", "interference",
                      "spec_accept_scale")
KERNEL_TTFT_PARAMS = ("first_token_steps", "queueing")
KERNEL_COVERED = {"moe_layer_overhead_us": 0.0, "prefill_expert_overhead_us": 0.0}
"""Overheads that a kernel-composed step already times (the fused MoE curve's fixed latency and its cost per
routed copy): zero, not double-counted, on hardware with kernel curves."""
"""The end-to-end factors left free on hardware whose step is composed from its own kernel curves (8 per hardware
and engine): what kernels cannot see, the share of the kernels' fixed latencies a graph-replayed step pays, the
engine's fixed costs per layer (norms, rotary, residual kernels) and sequence, the overlap it achieves, the
interference of interleaved prompts, its draft acceptance, the steps before a first token and closed-loop
queueing. The kernel-derived terms are frozen; the other factors keep the engine's fit over all
hardware (a prior shared by every hardware of the engine, not a per-hardware knob)."""
TTFT_PARAMS = ("attn_dp_wait_steps", "first_token_steps", "prefill_compute", "prefill_comm_bandwidth", "queueing", "ttft_overhead_ms", "prefill_expert_overhead_us")
BOUNDS = {
    "compute": (0.05, 1.0),
    "compute_fp8": (0.05, 1.0),
    "compute_fp4": (0.05, 1.0),
    "gemm_half_tokens": (0.0, 512.0),
    "attention_compute": (0.05, 1.0),
    "spec_accept_scale": (0.3, 1.0),
    "draft_overhead_us": (0.0, 5000.0),
    "attn_dp_wait_steps": (0.0, 200.0),
    "first_token_steps": (0.0, 100.0),
    "prefill_compute": (0.05, 1.0),
    "memory": (0.2, 1.0),
    "step_overhead_us": (0.0, 20000.0),
    "layer_overhead_us": (0.0, 500.0),
    "moe_layer_overhead_us": (0.0, 500.0),
    "seq_overhead_us": (0.0, 200.0),
    "collective_latency_us": (0.0, 200.0),
    "scale_out_latency_us": (0.0, 500.0),
    "comm_overlap": (0.0, 1.0),
    "interference": (0.0, 4.0),
    "prefill_comm_bandwidth": (0.05, 1.0),
    "queueing": (0.0, 1.0),
    "ttft_overhead_ms": (0.0, 3000.0),
    "prefill_expert_overhead_us": (0.0, 100.0),
    "kernel_fixed_share": (0.0, 1.0),
}
START = EngineEfficiency(
    compute=0.5, compute_fp8=0.5, compute_fp4=0.5, gemm_half_tokens=16.0, attention_compute=0.5,
    spec_accept_scale=0.9, draft_overhead_us=100.0, attn_dp_wait_steps=5.0, first_token_steps=2.0, prefill_compute=0.5, memory=0.8, step_overhead_us=500, layer_overhead_us=10, moe_layer_overhead_us=10, seq_overhead_us=5,
    collective_latency_us=10, scale_out_latency_us=20, prefill_comm_bandwidth=0.5, comm_overlap=0.3, interference=1.0, queueing=0.2, ttft_overhead_ms=30, prefill_expert_overhead_us=5,
)
# Measured relatives for hardware without rows of its own.
FAMILY = {
    "h800-sxm": "h100-sxm",
    "b300-sxm": "b200-sxm",
    "gb300-nvl72": "gb200-nvl72",
    "mi325x": "mi300x",
}


@dataclass
class FitResult:
    """Fitted factors: per (hardware, engine) where a pair has ``MIN_ROWS`` rows, per hardware (its
    default), per engine (the prior of every pair) and over all rows."""

    by_group: dict[tuple[str, str], EngineEfficiency]
    by_hw: dict[str, EngineEfficiency]
    by_engine: dict[str, EngineEfficiency]
    overall: EngineEfficiency
    rows: dict[tuple[str, str], int]
    rows_hw: dict[str, int]
    dropped: int
    overall_kernels: EngineEfficiency | None = None
    """The fit over hardware with kernel curves (the prior, and the transfer, of such hardware)."""
    by_engine_kernels: dict[str, EngineEfficiency] | None = None
    formats: dict[str, set[str]] | None = None
    """Per hardware, the compute factors (``compute``, ``compute_fp8``, ``compute_fp4``) its fitted rows run: the
    others are not set by its rows (:func:`efficiency_blocks` takes them from its kernels)."""
    free: dict[tuple[str, str], list[str]] | None = None
    """Per (hardware, engine) group, the factors fitted on its own rows (:func:`fit_pair`; at most
    :data:`PAIR_FREE`)."""
    first_wave: dict[str, float] | None = None
    """The first wave's one-time delay of benchmark runs by ``engine@vendor``, ``engine``, ``@vendor`` and ``""``
    (:func:`planner.calib.wave.delays`); :func:`efficiency_blocks` gives each hardware its own vendor's."""
    overruled: dict[str, list[str]] | None = None
    """Per hardware, the fused-MoE curves its engines' measured steps contradict (:mod:`planner.calib.consistency`):
    fitted, and written, with those MoE layers on the roofline."""
    anchor_rows: pd.DataFrame | None = None
    """Rows of hardware with too few for a fit of its own: they anchor its transferred factors
    (:func:`planner.calib.anchor.anchored`)."""


def _lo_hi(names):
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    return lo, hi


def _informed(norm, catalog, base: EngineEfficiency, names, target) -> list[str]:
    """The factors these rows inform: a factor that moves fewer than ``MIN_ROWS`` predictions by more than
    ``INFORM_DELTA`` when doubled (the expert overheads on rows of dense models; attention efficiency on rows of
    short-context GQA models) stays at its starting (prior) value instead of wandering where no row pins it and
    where production batches and contexts would inherit it."""
    r0 = _residuals(norm, catalog, base, target, weighted=False)
    out = []
    for n in names:
        lo, hi = BOUNDS[n]
        v = float(getattr(base, n))
        probe = min(max(2.0 * v, lo + 0.25 * (hi - lo)), hi) if v < hi else lo + 0.5 * (hi - lo)
        r1 = _residuals(norm, catalog, base.model_copy(update={n: probe}), target, weighted=False)
        if int(np.sum(np.abs(r1 - r0) > INFORM_DELTA)) >= MIN_ROWS:
            out.append(n)
    return out


def _fit_stage(norm, catalog, base: EngineEfficiency, names, target, prior: EngineEfficiency | None,
               kernels: bool = False) -> EngineEfficiency:
    names = _informed(norm, catalog, base, names, target)
    if not names:
        return base
    lo, hi = _lo_hi(names)
    x0 = np.clip(np.array([getattr(base, n) for n in names], dtype=float), lo + 1e-9, hi - 1e-9)
    scale = np.maximum(hi - lo, 1e-6)
    n = max(len(norm), 1)
    pri = np.array([getattr(prior, p) for p in names], dtype=float) if prior is not None else None
    phys = np.array([PHYSICS_PRIOR.get(p, np.nan) for p in names], dtype=float)
    has_phys = np.isfinite(phys)
    over = [(i, *OVERHEAD_PRIOR[p]) for i, p in enumerate(names) if kernels and p in OVERHEAD_PRIOR]

    def fun(z):
        x = lo + z * scale
        eff = base.model_copy(update=dict(zip(names, x, strict=True)))
        r = _residuals(norm, catalog, eff, target)
        if pri is not None:
            pen = SHRINK * np.sqrt(n) * (np.log1p(x) - np.log1p(pri)) / np.log(4.0)
            r = np.concatenate([r, pen])
        if has_phys.any():
            r = np.concatenate([r, PHYSICS_WEIGHT * np.sqrt(n) * np.log(x[has_phys] / phys[has_phys]) / np.log(2.0)])
        if over:
            r = np.concatenate([r, [OVERHEAD_WEIGHT * np.sqrt(n) * (x[i] - mu) / sd for i, mu, sd in over]])
        return r

    z0 = np.clip((x0 - lo) / scale, 1e-6, 1.0 - 1e-6)  # off the bounds, where the trust region would freeze it
    sol = least_squares(fun, z0, bounds=(0.0, 1.0), loss="soft_l1", f_scale=F_SCALE, diff_step=1e-3, max_nfev=200)
    x = lo + sol.x * scale
    return base.model_copy(update={k: float(round(v, 4)) for k, v in zip(names, x, strict=True)})


def fit_group(norm, catalog, start: EngineEfficiency, prior: EngineEfficiency | None = None,
              kernels: bool = False, fixed_share: bool = False, only=None) -> EngineEfficiency:
    """TPOT factors, then TTFT factors, at least twice and until a round cuts the loss by no more than
    :data:`CONVERGED`: prefill capacity feeds the decode batch of disaggregated rows, so the TPOT factors are
    refitted once the prefill factors have moved. ``kernels``: the rows' hardware composes
    its step from kernel curves, so only :data:`KERNEL_TPOT_PARAMS` and :data:`KERNEL_TTFT_PARAMS` are free.
    ``fixed_share``: the catalog times some terms by kernel curves (``KernelFits.terms``), so ``kernel_fixed_share``
    (the share of those curves' fixed latencies a graph-replayed step pays) is free too. ``only``: fit these
    factors alone (:func:`fit_pair`), the rest held at ``start``."""
    tpot, ttft = (KERNEL_TPOT_PARAMS, KERNEL_TTFT_PARAMS) if kernels else (TPOT_PARAMS, TTFT_PARAMS)
    if fixed_share and not kernels:
        tpot = tpot + ("kernel_fixed_share",)
    if only is not None:
        tpot, ttft = (tuple(p for p in names if p in only) for names in (tpot, ttft))
    eff, last = start, np.inf
    for i in range(MAX_ROUNDS):
        eff = _fit_stage(norm, catalog, eff, tpot, "tpot", prior, kernels)
        eff = _fit_stage(norm, catalog, eff, ttft, "ttft", prior, kernels)
        loss = data_loss(norm, catalog, eff)
        if i + 1 >= ROUNDS and loss > (1.0 - CONVERGED) * last:
            break
        last = loss
    return eff


def free_factors(eff: EngineEfficiency, prior: EngineEfficiency) -> list[str]:
    """The factors of ``eff`` that its rows moved away from ``prior`` (by more than 0.1%, or 1e-4 from zero)."""
    out = []
    for k in BOUNDS:
        a, b = float(getattr(eff, k)), float(getattr(prior, k))
        if abs(a - b) > max(1e-3 * abs(b), 1e-4):
            out.append(k)
    return out


def fit_pair(norm, catalog, prior: EngineEfficiency, kernels: bool = False, fixed_share: bool = False,
             limit: int = PAIR_FREE, label: str = "") -> tuple[EngineEfficiency, list[str]]:
    """(factors, the ones fitted on these rows) of one (hardware, engine) group: at most ``limit`` factors of its
    own, the rest the ``prior`` (the hardware's silicon and links from its fit over all its engines, the engine's
    fixed costs from its fit over all hardware). Every factor the rows inform is fitted first, then
    :func:`restrict` keeps ``limit`` of them. ``label`` names the pair in the log."""
    full = fit_group(norm, catalog, prior, prior, kernels, fixed_share)
    return restrict(norm, catalog, full, prior, kernels, fixed_share, limit, label)


def restrict(norm, catalog, full: EngineEfficiency, prior: EngineEfficiency, kernels: bool = False,
             fixed_share: bool = False, limit: int = PAIR_FREE, label: str = "",
             rule: str = "profile") -> tuple[EngineEfficiency, list[str]]:
    """``full`` (a group's fit with every factor its rows inform free) cut to at most ``limit`` factors of its own:
    the ``limit`` kept are those with whose refit the return of all the others to the prior costs the rows least
    (:mod:`planner.calib.profile`: a factor whose effect another can take up is not kept for that effect), refitted
    alone from ``full``'s values, so they take up what the others, back at the prior, no longer can. ``rule``
    "alone": the rule before (the ``limit`` whose return alone, the others held, costs most), kept for
    ``bench/pair_cv.py``'s comparison."""
    free = free_factors(full, prior)
    log.info("pair fit %s: %d factors moved from the prior", label, len(free))
    if len(free) <= limit:
        return full, free
    r0 = _residuals(norm, catalog, full, "ttft")
    delta = np.array([float(getattr(prior, f)) - float(getattr(full, f)) for f in free])
    jac = np.column_stack([
        (_residuals(norm, catalog, full.model_copy(update={f: getattr(prior, f)}), "ttft") - r0) / d
        for f, d in zip(free, delta, strict=True)])
    if rule == "alone":
        alone = [_robust(r0 + jac[:, i] * d) for i, d in enumerate(delta)]  # the loss with it alone back
        idx, cost = sorted(np.argsort(alone)[::-1][:limit].tolist()), float("nan")
    else:
        idx, cost = keep_by_profile(jac, 1.0 / np.sqrt(1.0 + (r0 / F_SCALE) ** 2), r0, delta, limit)
    keep = [free[i] for i in idx]
    log.info("pair fit %s: kept %s%s", label, keep,
             "" if np.isnan(cost) else f" (profile cost of the others' return {cost:.4g})")
    start = prior.model_copy(update={f: getattr(full, f) for f in keep})
    eff = fit_group(norm, catalog, start, prior, kernels, fixed_share, only=set(keep))
    return eff, [f for f in keep if f in free_factors(eff, prior)]


def data_loss(norm, catalog, eff: EngineEfficiency) -> float:
    """The robust loss of ``norm``'s TPOT and TTFT residuals under ``eff`` (what :func:`_fit_stage` minimises,
    without the pulls toward the priors)."""
    return _robust(_residuals(norm, catalog, eff, "ttft"))


def _robust(r: np.ndarray) -> float:
    z = (r / F_SCALE) ** 2
    return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)) * F_SCALE ** 2)


def kernel_terms(catalog: Catalog, hw_id: str) -> bool:
    """Whether ``hw_id``'s roofline step times some of its terms by its own kernel curves (``KernelFits.terms``,
    a partial composition)."""
    kf = catalog.hardware[hw_id].efficiency.kernels
    return kf is not None and not kf.compose and bool(kf.terms)


def roofline_catalog(catalog: Catalog) -> Catalog:
    """``catalog`` with no term of a roofline step timed by kernel curves (every ``KernelFits.terms`` emptied): the
    physics of hardware without curves, on which the all-hardware fit that such hardware inherits is made."""
    return update_kernels(catalog, {h: {"terms": []} for h in catalog.hardware if kernel_terms(catalog, h)})


def has_kernels(catalog: Catalog, hw_id: str) -> bool:
    """Whether ``hw_id``'s step is composed from its own kernel curves."""
    kf = catalog.hardware[hw_id].efficiency.kernels
    return kf is not None and kf.compose


def prepare(data, catalog: Catalog) -> tuple[pd.DataFrame, int]:
    """The fittable rows of ``data`` (a silicon DataFrame, or a list of :class:`planner.calib.data.Measured`
    files of either format) as one normalised frame with a ``src`` column, and how many rows were left out."""
    from pathlib import Path

    from planner.calib.data import Measured, normalise
    from planner.calib.shared import repeated_rows, silicon_copies

    sets = data if isinstance(data, list) else [Measured(Path("rows"), "silicon", data, normalise(data, catalog))]
    # A run exported to both formats is fitted once, as the InferenceX copy, which records its speculative decoding
    # (the silicon copy of an MTP run reads as a plain run ~1.6x slower than measured); a run a file records twice,
    # once.
    copies = silicon_copies(sets)
    frames = []
    for m in sets:
        n = m.norm.copy()
        n["src"] = m.path.name
        n["row_in_file"] = n.index
        n["n_copy"] = n.index.isin(copies.get(m.path.name, pd.Index([]))) | repeated_rows(m.norm).to_numpy(bool)
        frames.append(n)
    norm = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    # Disaggregated rows that do not record their worker counts are predicted (and reported) but not
    # fitted on: their per-worker batch and prefill capacity are guesses. Nor are concurrency sweeps that were not
    # measured in a steady state (``n_inconsistent``: TPOT falling as concurrency rises, ``calib.checks``).
    ok = (norm["reason"] == "") & (norm["m_ttft"] > 0) & (norm["m_tpot"] > 0) & ~norm["n_workers_assumed"].astype(bool)
    ok &= ~unsteady(norm) & ~norm["n_copy"].to_numpy(bool)
    norm = norm[ok].drop(columns="n_copy")
    # Each file weighs the same in the fit, whatever its row count (a small file of production-scale runs is
    # not drowned by a large one of small benchmark batches), and within a (hardware, engine) pair by what its campaign
    # tells (:func:`campaign_weights`); weights average 1. Rows of hardware with too few rows
    # for a fit of its own only anchor that hardware (:mod:`planner.calib.anchor`) and weigh nothing here.
    fitted = ~norm["n_hw"].isin(few_row_hardware(norm, MIN_ROWS))
    main = norm[fitted]
    counts = main["src"].map(main["src"].value_counts()).astype(float)
    norm["w"] = 1.0
    norm.loc[fitted, "w"] = campaign_weights(main, len(main) / (max(main["src"].nunique(), 1) * counts))
    return norm, int((~ok).sum())


CAMPAIGN_ROWS = 7.7
"""Rows of one file worth its campaign's bias: the ratio of the within-file variance of a pair's log TPOT residuals
(0.055) to the variance of the files' own offsets on the same (hardware, engine) pair (0.0072; up to 0.017 on B200
TensorRT-LLM, where the silicon file's rows sit 8% slow and InferenceX's 11% fast of one prediction: engine versions,
harnesses), estimated by moments over the 8 pairs both files measure, on the fitted rows and the catalog of
2026-12-07 (``python bench/campaign_variance.py --data SILICON --data INFERENCEX``)."""


def campaign_weights(rows: pd.DataFrame, w: pd.Series) -> pd.Series:
    """Row weights that give each file's campaign on a (hardware, engine) pair the weight of what it tells about
    the pair's factors: a file's rows share that campaign's bias (its engine version, its harness), so ``n`` of them
    are worth ``n / (n + CAMPAIGN_ROWS)`` of an unbiased measurement (random-effects pooling: within-file scatter
    averages out over rows, the campaign's offset does not), not ``n`` rows. Each pair keeps its total weight
    (``w`` summed over its rows), so the per-engine and all-hardware fits weigh the pairs as before; within a pair
    two files of 400 and 100 rows weigh about alike instead of 4:1."""
    pair = [rows["n_hw"], rows["n_engine"]]
    n = rows.groupby([*pair, rows["src"]])["src"].transform("size").astype(float)
    info = n / (n + CAMPAIGN_ROWS)
    share = info / n  # each row's part of its file's information
    total = w.groupby(pair).transform("sum")
    return total * share / share.groupby(pair).transform("sum")


def fit(data, catalog: Catalog) -> FitResult:
    """Fit on ``data`` (see :func:`prepare`)."""
    norm, dropped = prepare(data, catalog)
    return fit_norm(norm, catalog, dropped, total=len(norm) + dropped)


def fit_norm(norm: pd.DataFrame, catalog: Catalog, dropped: int = 0, total: int | None = None) -> FitResult:
    """Fit per engine, per hardware and engine, and per hardware on prepared rows (:func:`prepare`). Rows of hardware
    with fewer than ``MIN_ROWS`` rows enter no fit: they anchor that hardware's transferred factors
    (:mod:`planner.calib.anchor`)."""
    few = norm["n_hw"].isin(few_row_hardware(norm, MIN_ROWS))
    anchor_rows, norm = norm[few], norm[~few]
    if len(norm) < MIN_ROWS:
        raise InputError(
            f"only {len(norm)} of {total if total is not None else len(norm)} rows can be fitted (known model and system, "
            f"positive measured TTFT and TPOT, worker counts for disagg rows, at least {MIN_ROWS} of a hardware); "
            f"at least {MIN_ROWS} are needed"
        )
    # Kernel curves that the engines' own measured steps contradict leave the composition (KernelFits.overruled).
    overruled = overruled_curves(norm, catalog)
    catalog = with_overruled(catalog, overruled)
    # The all-hardware fit, which hardware without kernel curves inherits, is made on the roofline alone; hardware
    # whose step times some terms by its own curves (``kernel_terms``) gets priors and a transfer fitted on such
    # hardware's rows with those terms on.
    terms = norm["n_hw"].map(lambda h: kernel_terms(catalog, h)).to_numpy(bool)
    rf = roofline_catalog(catalog) if terms.any() else catalog
    fit = partial(fit_group, fixed_share=bool(terms.any()))
    overall = fit(norm, rf, START)
    log.info("overall fit over %d rows", len(norm))
    by_engine: dict[str, EngineEfficiency] = {}
    for eng, g in norm.groupby("n_engine"):
        by_engine[eng] = fit(g, rf, overall, overall)
    # Hardware whose step is composed from kernel curves gets priors fitted on such hardware alone, with only the
    # end-to-end factors free and the overheads its curves already time set to zero.
    kmask = norm["n_hw"].map(lambda h: has_kernels(catalog, h)).to_numpy(bool)
    overall_k, by_engine_k = overall, dict(by_engine)
    if terms.any():
        overall_k = fit(norm[terms], catalog, overall, overall)
        by_engine_k = {eng: fit(g, catalog, overall_k, overall_k) for eng, g in norm[terms].groupby("n_engine")}
    elif kmask.sum() >= MIN_ROWS:
        ks = overall.model_copy(update=KERNEL_COVERED)
        overall_k = fit_group(norm[kmask], catalog, ks, ks, kernels=True)
        by_engine_k = {eng: fit_group(g, catalog, overall_k, overall_k, kernels=True)
                       for eng, g in norm[kmask].groupby("n_engine")}
    by_hw: dict[str, EngineEfficiency] = {}
    rows_hw: dict[str, int] = {}
    for hw, g in norm.groupby("n_hw"):
        rows_hw[hw] = len(g)
        k = has_kernels(catalog, hw)
        base = overall_k if k or kernel_terms(catalog, hw) else overall
        by_hw[hw] = fit(g, catalog, base, base, k)
    by_group: dict[tuple[str, str], EngineEfficiency] = {}
    free: dict[tuple[str, str], list[str]] = {}
    rows: dict[tuple[str, str], int] = {}
    for (hw, eng), g in norm.groupby(["n_hw", "n_engine"]):
        rows[(hw, eng)] = len(g)
        if len(g) >= MIN_ROWS:
            k = has_kernels(catalog, hw)
            own = by_engine_k if k or kernel_terms(catalog, hw) else by_engine
            prior = group_prior(by_hw[hw], own.get(eng, by_engine[eng]))
            by_group[(hw, eng)], free[(hw, eng)] = fit_pair(g, catalog, prior, k, bool(terms.any()),
                                                                  label=f"{hw}/{eng}")
    res = FitResult(by_group, by_hw, by_engine, overall, rows, rows_hw, dropped, overall_k, by_engine_k,
                    row_formats(norm, catalog), free=free, overruled=overruled,
                    anchor_rows=anchor_rows if len(anchor_rows) else None)
    return fit_first_wave(norm, catalog, res)


def row_formats(norm: pd.DataFrame, catalog: Catalog) -> dict[str, set[str]]:
    """Per hardware, the compute factors its rows' dense and expert maths formats use."""
    out: dict[str, set[str]] = {}
    for (hw, dense, expert), _ in norm.groupby(["n_hw", "n_dense", "n_expert"]):
        h = catalog.hardware[hw]
        out.setdefault(hw, set()).update(FORMAT_FACTOR.get(factor_dtype(h, d), "compute") for d in (dense, expert))
    return out


def group_prior(hw: EngineEfficiency, engine: EngineEfficiency) -> EngineEfficiency:
    """Prior of a (hardware, engine) group: the hardware's fit for :data:`HARDWARE_FACTORS`, the engine's for
    the rest (its overheads, scheduling and speculation). On kernel-composed hardware the hardware factors are
    unused by the step (its kernel curves time those terms)."""
    return engine.model_copy(update={k: getattr(hw, k) for k in HARDWARE_FACTORS})


def efficiency_blocks(result: FitResult, catalog: Catalog, data_name: str, as_of: dt.date | None = None) -> dict[str, Efficiency]:
    """One ``Efficiency`` per catalog hardware entry from a fit. Hardware without measured rows takes the
    factors of its measured relative (``FAMILY``) or of the all-hardware fit, and says so
    (``transferred_from``, ``fitted_rows: 0``); per-engine blocks only for engines that run on it."""
    as_of = as_of or dt.date.today()
    out: dict[str, Efficiency] = {}
    for hid, hw in catalog.hardware.items():
        runs = {e.id for e in catalog.engines_for(hw)} if catalog.engines else None

        def keep(eng: str, runs=runs) -> bool:
            return runs is None or eng in runs

        if hid in result.by_hw:
            engines = {eng: eff for (h, eng), eff in result.by_group.items() if h == hid and keep(eng)}
            n = result.rows_hw[hid]
            out[hid] = Efficiency(
                source=f"fitted by `planner calibrate fit` on {n} measured rows of {data_name} "
                f"(per engine where >= {MIN_ROWS} rows)",
                as_of=as_of,
                default=result.by_hw[hid],
                by_engine=engines,
                free_factors={eng: list((result.free or {}).get((hid, eng), [])) for eng in engines},
                fitted_rows=n,
                engine_rows={eng: k for (h, eng), k in result.rows.items() if h == hid and keep(eng)},
            )
            continue
        rel = FAMILY.get(hid)
        if rel in result.by_hw:
            engines = {eng: eff for (h, eng), eff in result.by_group.items() if h == rel and keep(eng)}
            own = has_kernels(catalog, hid)
            out[hid] = Efficiency(
                source=(f"kernel curves from {hid}'s own kernels; engine overheads transferred from {rel} (same vendor "
                        f"and generation; no measured serving rows for {hid} in {data_name})") if own else
                f"transferred from {rel} (same vendor and generation; no measured rows for {hid} in {data_name})",
                as_of=as_of,
                default=result.by_hw[rel],
                by_engine=engines,
                fitted_rows=0,
                transferred_from=rel,
            )
        else:
            own = (has_kernels(catalog, hid) or kernel_terms(catalog, hid)) and result.overall_kernels is not None
            overall = result.overall_kernels if own else result.overall
            engines = (result.by_engine_kernels or result.by_engine) if own else result.by_engine
            out[hid] = Efficiency(
                source=(f"kernel curves from {hid}'s own kernels; engine overheads transferred from the fit over "
                        f"kernel-composed hardware of {data_name} (no measured serving rows for {hid})") if own else
                f"transferred from the all-hardware fit of {data_name} (no measured rows for {hid}); "
                "treat its predictions as unvalidated",
                as_of=as_of,
                default=overall,
                by_engine={eng: eff for eng, eff in engines.items() if keep(eng)},
                fitted_rows=0,
                transferred_from="all-hardware",
            )
    # The kernel curves are fitted by `calibrate kernels` on other data: an end-to-end refit keeps them, with the
    # curves its rows overrule (hardware that takes a relative's factors, the relative's, which those were fitted with).
    out = {hid: set_vendor_delays(eff.model_copy(update={"kernels": _kernels(catalog, hid, result, eff)}),
                                  result.first_wave, catalog.hardware[hid].vendor) for hid, eff in out.items()}
    out = {hid: kernel_silicon(eff, catalog, hid, result) for hid, eff in out.items()}
    return anchored(out, result.anchor_rows, catalog, data_name, BOUNDS, INFORM_DELTA)


def _kernels(catalog: Catalog, hid: str, result: FitResult, eff: Efficiency):
    kf = catalog.hardware[hid].efficiency.kernels
    if kf is None or result.overruled is None:
        return kf
    return kf.model_copy(update={"overruled": list(result.overruled.get(eff.transferred_from or hid, []))})


def kernel_silicon(eff: Efficiency, catalog: Catalog, hid: str, result: FitResult) -> Efficiency:
    """``eff`` with the silicon factors its serving rows cannot set taken from ``hid``'s own kernel curves
    (:mod:`planner.calib.silicon`): on measured hardware the compute factors of formats none of its rows runs
    (absolute kernel fractions); on hardware transferred from a measured relative every silicon factor, scaled by
    the two systems' kernel ratio; on hardware given the all-hardware fit, every silicon factor (absolute)."""
    hw = catalog.hardware[hid]
    if hw.efficiency.kernels is None:
        return eff
    rel = catalog.hardware.get(eff.transferred_from or "")
    scaled = eff.fitted_rows == 0 and rel is not None and rel.efficiency.kernels is not None
    if eff.fitted_rows > 0:
        ran = (result.formats or {}).get(hid, set(S.FORMAT_FACTORS))
        facs = [f for f in S.FORMAT_FACTORS if f not in ran]
    else:
        facs = list(S.SILICON_FACTORS)

    def move(block, engine):
        return S.relative(block, hw, rel, engine, facs) if scaled else S.absolute(block, hw, engine, facs)

    default, names = move(eff.default, None)
    engines = {}
    for e, b in eff.by_engine.items():
        engines[e], more = move(b, e)
        names = sorted(set(names) | set(more))
    if not names:
        return eff
    how = f"scaled from {rel.id} by the ratio of the two systems' kernel curves" if scaled else "from its own kernel curves"
    return eff.model_copy(update={"default": default, "by_engine": engines, "kernel_factors": names,
                                  "source": f"{eff.source}; {', '.join(names)} {how} (planner.calib.silicon)"})
