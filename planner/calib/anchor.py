"""Anchor a chip that has a few measured serving rows, too few for a fit of its own, on those rows.

A chip with fewer than :data:`planner.calib.fit.MIN_ROWS` fittable rows gets no fit of its own: its factors are
transferred (its measured relative's, else the all-hardware fit; :func:`planner.calib.fit.efficiency_blocks`). What a
transfer cannot know are what a platform's software sets and no datasheet gives: the fixed cost of one decode step
on it (host scheduling, runtime launch, the sampler: ``step_overhead_us``) and the rate its prefill actually reaches
(its collectives' share of the link, ``prefill_comm_bandwidth``, and its compute rate, ``prefill_compute``). A
published measurement of TPOT and TTFT pins them, so such rows anchor exactly these factors (:data:`ANCHORS`) on top
of the transfer, and nothing else: the silicon, decode link and scheduling factors stay the transfer's, and the rows
enter no other fit (a file of one row would otherwise weigh as
much as a file of thousands in the pooled fits; :func:`planner.calib.fit.prepare`).

Why the per-step cost and not a per-layer or per-collective one: AWS Neuron's Llama-3.1-405B and Llama-3.3-70B runs
on one trn2.48xlarge (batch 1, 10,000-token prompts, BF16, TP64) measure 37.9 and 19.8 ms TPOT where the transferred
roofline says 30.5 and 9.0 ms. The gap is about the same for both models (7.4 and 10.8 ms) although the larger has
1.6x the layers and all-reduces: a per-step cost anchored on one predicts the other at 1.20x (a per-all-reduce
latency anchored the same way, 1.4x). See docs/validation.md, "A chip anchored on one published run".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from planner.calib.predict import log_residuals
from planner.calib.wave import F_SCALE
from planner.catalog import Catalog, Efficiency, EngineEfficiency

ANCHORS = {"tpot": ("step_overhead_us",), "ttft": ("prefill_comm_bandwidth", "prefill_compute")}
"""The factors measured rows anchor on a chip without a fit of its own, by the latency that pins each, fitted one
after the other. A prompt's pass is its compute plus its collectives; of the two, the share of the link rate a
platform's collectives reach during prefill is what a transfer from another vendor's fabric knows least, so it is
anchored first (within its bounds, 5-100% of the datasheet link), and the compute rate takes what remains."""
ROUNDS = 2
"""Alternations of the TPOT and the TTFT anchor (prefill capacity can move the decode batch of a disaggregated row)."""


def few_row_hardware(norm: pd.DataFrame, min_rows: int) -> set[str]:
    """Hardware with fittable rows, but fewer than ``min_rows``: anchored, not fitted (and left out of every fit)."""
    counts = norm["n_hw"].value_counts()
    return {str(h) for h, n in counts.items() if 0 < n < min_rows}


def _fit_one(rows: pd.DataFrame, catalog: Catalog, eff: EngineEfficiency, name: str, target: str,
             bounds: tuple[float, float], inform: float) -> EngineEfficiency:
    """``eff`` with ``name`` fitted within ``bounds`` on ``rows`` (robust least squares on log predicted / measured),
    or unchanged when doubling it moves no row's prediction by more than ``inform``. Not the fit's own stage
    (:func:`planner.calib.fit._fit_stage`), which wants ``MIN_ROWS`` informing rows and pulls toward the physical
    priors: here one row decides alone. Like the stage, it starts a millionth of the range inside the bounds (on a
    bound the trust region's scaling would leave the factor frozen)."""
    lo, hi = bounds
    r0 = log_residuals(rows, catalog, eff, target, weighted=False)
    v = float(getattr(eff, name))
    probe = min(max(2.0 * v, lo + 0.25 * (hi - lo)), hi) if v < hi else lo + 0.5 * (hi - lo)
    r1 = log_residuals(rows, catalog, eff.model_copy(update={name: probe}), target, weighted=False)
    if not np.any(np.abs(r1 - r0) > inform):
        return eff

    def fun(z):
        return log_residuals(rows, catalog, eff.model_copy(update={name: float(lo + z[0] * (hi - lo))}), target,
                             weighted=False)

    z0 = np.clip((v - lo) / (hi - lo), 1e-6, 1.0 - 1e-6)
    sol = least_squares(fun, [z0], bounds=(0.0, 1.0), loss="soft_l1", f_scale=F_SCALE, diff_step=1e-3, max_nfev=200)
    return eff.model_copy(update={name: float(round(lo + sol.x[0] * (hi - lo), 4))})


def anchor_block(rows: pd.DataFrame, catalog: Catalog, eff: EngineEfficiency, bounds: dict[str, tuple[float, float]],
                 inform: float) -> tuple[EngineEfficiency, list[str]]:
    """(``eff`` with :data:`ANCHORS` fitted on ``rows``, the anchored factors that moved); ``bounds`` and ``inform`` are
    the fit's (:data:`planner.calib.fit.BOUNDS`, :data:`planner.calib.fit.INFORM_DELTA`)."""
    out = eff
    for _ in range(ROUNDS):
        for target, names in ANCHORS.items():
            for name in names:
                out = _fit_one(rows, catalog, out, name, target, bounds[name], inform)
    moved = [n for names in ANCHORS.values() for n in names
             if abs(float(getattr(out, n)) - float(getattr(eff, n))) > max(1e-3 * abs(float(getattr(eff, n))), 1e-4)]
    return out, moved


def anchored(blocks: dict[str, Efficiency], rows: pd.DataFrame | None, catalog: Catalog, data_name: str,
             bounds: dict[str, tuple[float, float]], inform: float) -> dict[str, Efficiency]:
    """``blocks`` with each transferred hardware that has ``rows`` anchored on them: every engine block with rows of
    its own, and the default on all of them (``data_name`` names the rows' file where they carry no ``src``). An engine
    the hardware's block does not list (one that does not run on it) anchors only the default. The block stays a
    transfer (``fitted_rows`` 0, ``transferred_from``); ``engine_rows`` and ``free_factors`` record the rows and the
    factors they set, and ``source`` says so."""
    if rows is None or rows.empty:
        return blocks
    out = dict(blocks)
    for hid, g in rows.groupby("n_hw"):
        eff = out.get(str(hid))
        if eff is None or eff.fitted_rows > 0:
            continue
        default, moved = anchor_block(g, catalog, eff.default, bounds, inform)
        engines, free, counts = dict(eff.by_engine), {}, {}
        for eng, h in g.groupby("n_engine"):
            if str(eng) not in eff.by_engine:
                continue
            engines[str(eng)], free[str(eng)] = anchor_block(h, catalog, eff.by_engine[str(eng)], bounds, inform)
            counts[str(eng)] = len(h)
            moved = sorted(set(moved) | set(free[str(eng)]))
        n = len(g)
        files = " and ".join(sorted(g["src"].astype(str).unique())) if "src" in g.columns else data_name
        note = (f"; {', '.join(moved)} anchored on {n} measured row{'s' if n != 1 else ''} of {files} "
                "(planner.calib.anchor)") if moved else ""
        source = eff.source.replace(f"no measured rows for {hid}",
                                    f"{n} measured row{'s' if n != 1 else ''} for {hid}, too few for a fit of its own")
        out[str(hid)] = eff.model_copy(update={"default": default, "by_engine": engines, "engine_rows": counts,
                                               "free_factors": free, "source": source + note})
    return out
