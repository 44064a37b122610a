"""Predict TTFT and TPOT of measured rows from physics and the catalog's efficiency factors.

Predictions never look at the measured columns: each row is turned into a model, a hardware, number
formats, a layout and a load, and evaluated with ``perf/``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import pandas as pd

from planner.calib.checks import unsteady
from planner.catalog import Catalog, EngineEfficiency
from planner.catalog.schemas import ENGINES
from planner.errors import InputError
from planner.perf.layout import expert_copies
from planner.perf.roofline import Setup, prefill_time
from planner.perf.serving import (
    admission_wait,
    agg_decode,
    closed_loop_ttft,
    decode_batch_fed_by_prefill,
    disagg_decode,
    kv_capacity_sequences,
    kv_transfer_time,
    others_share,
    prefill_capacity_rps,
    ttft,
)
from planner.perf.setup import engine_options

EffFor = Callable[[str, str], EngineEfficiency]

SPEC_TOKENS_ASSUMED = 3.0
"""Draft tokens per step tried when a row leaves speculative decoding open: an assumption (a chain of
three MTP / EAGLE drafts), not a recorded value; ``Setup.spec_accept`` gives their acceptance."""
ASSUMED_VARIANTS = ((False, 0.0), (True, 0.0), (False, SPEC_TOKENS_ASSUMED), (True, SPEC_TOKENS_ASSUMED))
"""(attention data parallel, draft tokens) deployments tried for rows that leave them open."""

ADMIT_OUTPUT_SHARE = {"trtllm": 1.0}
"""Share of the output length an engine reserves in KV when it admits a request (default 0.5: the mean
in-flight context of a closed loop, for engines that allocate as tokens arrive and preempt when full,
as SGLang and vLLM do). TensorRT-LLM's default capacity scheduler (GUARANTEED_NO_EVICT) admits a
request only when its whole prompt and output fit."""


def catalog_efficiency(catalog: Catalog) -> EffFor:
    def eff_for(hw_id: str, engine: str) -> EngineEfficiency:
        return catalog.hardware[hw_id].efficiency.for_engine(engine)

    return eff_for


def predict_normalised(norm: pd.DataFrame, catalog: Catalog, eff_for: EffFor | None = None) -> pd.DataFrame:
    """Return ``predicted_ttft_ms``, ``predicted_tpot_ms`` and ``predicted_output_tput_per_gpu`` (NaN where
    ``reason`` is set), and the tails of a measured benchmark run (``predicted_ttft_p99_ms``,
    ``predicted_tpot_p99_ms``, ``predicted_itl_p50_ms``, ``predicted_itl_p99_ms``; see :func:`_closed_tails`), and
    for aggregated rows the sequences a replica's KV cache holds under its engine's admission policy
    (``predicted_held_sequences``; NaN for disaggregated rows).

    Rows that record their whole deployment are evaluated as recorded. Disaggregated rows without
    worker counts (``n_workers_assumed``) leave the deployment open, so they are evaluated as the
    tuned deployment the recorded chips allow: each of :data:`ASSUMED_VARIANTS` (attention layout as
    recorded or data-parallel; speculative decoding off or on) is predicted and the one with the
    lowest TPOT for the row's load is reported, which is what a sweep tuned per load point runs.

    Output throughput per GPU is what a closed loop of ``conc`` clients sustains: each client's request
    takes ``TTFT + (O - 1) TPOT``, so ``conc * O / (TTFT + (O - 1) TPOT)`` output tokens/s over the GPUs
    the benchmark divides by (``n_gpus_out``).
    """
    eff_for = eff_for or catalog_efficiency(catalog)
    ttft_ms = pd.Series(np.nan, index=norm.index)
    tpot_ms = pd.Series(np.nan, index=norm.index)
    tails_ms = {k: pd.Series(np.nan, index=norm.index) for k in TAILS + WAVE_PARTS}
    unheld = pd.Series(False, index=norm.index)
    held = pd.Series(np.nan, index=norm.index)
    ok = norm[norm["reason"] == ""]
    for col in ("n_spec", "a_red", "p_red", "d_red"):
        if col not in ok.columns:
            ok = ok.assign(**{col: np.nan if col == "n_spec" else 0.0})
    # a run that records attention-DP prefill balancing (``n_adp_balance``: "on" / "off") is evaluated with it, others
    # with their engine's (``attention_dp_prefill_balance``)
    rec = ok["n_adp_balance"] if "n_adp_balance" in ok.columns else pd.Series(None, index=ok.index, dtype=object)
    ok = ok.assign(n_adp_balance=rec.map({True: "on", False: "off"}).fillna("engine"))
    keys = ["n_model", "n_hw", "n_engine", "n_dense", "n_expert", "n_kv", "n_mode", "n_adp_balance"]
    for key, g in ok.groupby(keys, sort=False):
        mid, hid, eng, dd, ed, kd, mode, balance = key
        engine = catalog.engines.get(eng)
        opts = engine_options(engine)
        if balance != "engine":  # the run records its own attention-DP prompt balance
            opts["adp_prefill_balance"] = balance == "on"
        make = partial(Setup, catalog.models[mid], catalog.hardware[hid], eff_for(hid, eng), dd, ed, kd, engine=eng,
                       **opts)
        tails: dict = {}
        if mode == "agg":
            t1, st = _agg(make(spec_tokens=g["n_spec"].fillna(0.0).to_numpy(float)), g, eng, tails)
        else:
            t1, st = _disagg(make(spec_tokens=g["n_spec"].fillna(0.0).to_numpy(float)), g, eng, tails)
            assumed = g["n_workers_assumed"].to_numpy(bool)
            for v in tails.values():
                v[assumed] = np.nan  # the tuned variant's tails are not computed
            if assumed.any():
                g = g.copy()
                g.loc[g.index[assumed]] = _holding_layout(make(), g[assumed], eng)
                t1, st = t1.copy(), st.copy()
                t1[assumed], st[assumed] = _tuned(make, g[assumed], eng)
        tpot_ms.loc[g.index] = st * 1e3
        ttft_ms.loc[g.index] = t1 * 1e3
        for k, v in tails.items():
            tails_ms[k].loc[g.index] = v * 1e3
        roles = ("a",) if mode == "agg" else ("p", "d")
        caps = [_capacity(make(), g, r, eng) for r in roles]
        unheld.loc[g.index] = np.any([c < 1.0 for c in caps], axis=0)
        if mode == "agg":
            held.loc[g.index] = caps[0]
    # A layout that cannot hold the weights with room for one sequence (as recorded, or for open rows even
    # at the largest TP the heads allow) did not run: no number for it.
    ttft_ms[unheld] = np.nan
    tpot_ms[unheld] = np.nan
    for v in tails_ms.values():
        v[unheld] = np.nan
    O = norm["n_osl"].astype(float)
    batch = pd.Series(np.where(norm["n_mode"] == "agg", norm["a_batch"], norm["d_batch"] * norm["d_workers"]), index=norm.index)
    conc = norm["n_conc"].astype(float).fillna(batch.astype(float))
    e2el = ttft_ms / 1e3 + (O - 1.0).clip(lower=0.0) * tpot_ms / 1e3
    gpus = norm["n_gpus_out"].astype(float) if "n_gpus_out" in norm.columns else pd.Series(np.nan, index=norm.index)
    otpg = conc * O / e2el / gpus
    if "n_requests" in norm.columns:
        # a run of a fixed number of requests: its output over its whole duration, first wave and drain included
        otpg = otpg * finite_run_share(conc, norm["n_requests"].astype(float), e2el, ttft_ms / 1e3,
                                       tails_ms["wave_idle"].fillna(0.0) / 1e3)
    return pd.DataFrame({"predicted_ttft_ms": ttft_ms, "predicted_tpot_ms": tpot_ms,
                         "predicted_output_tput_per_gpu": otpg, "layout_cannot_hold": unheld,
                         "predicted_held_sequences": held,
                         **{f"predicted_{k}_ms": v for k, v in tails_ms.items()}})


TAILS = ("ttft_p99", "tpot_p99", "itl_p50", "itl_p99")
WAVE_PARTS = ("ttft_steady", "ttft_wave", "wave_idle")
"""The two candidates of a closed loop's p99 TTFT before the engine's ``first_wave_s`` (the steady state's and the
first wave's), kept beside the tails for the fit of ``first_wave_s`` (:mod:`planner.calib.wave`), and the decode time
the first wave leaves idle per client (``wave_idle``, :func:`finite_run_share`)."""
WAVE_SHARE = 0.9
"""Where in the first wave the p99 request of a benchmark run sits: the InferenceX client (InferenceMAX's
``benchmark_serving.py --num-prompts $((CONC * 10)) --max-concurrency $CONC --request-rate inf``) releases ``conc``
requests at once and runs ten times as many, so the slowest 1% of all are the slowest 10% of the first wave, which
waits behind the prompts released with it."""
BENCH_LENGTH_CV2 = (0.2 / 0.9) ** 2 / 12.0
"""Squared coefficient of variation of the benchmark's lengths, uniform over ``[0.8 L, L]``."""
WAVE_PROMPTS = 2.0 - np.sqrt(2.0 * (1.0 - WAVE_SHARE))
"""Prompts (in units of the ``B - 1`` a steady-state request decodes beside) that the p99 request of an aggregated
closed loop decodes beside. A request of the first wave prefilled ``k``-th of ``B`` decodes through the ``B - k``
prompts released with it that are prefilled after its first token, then, before its own ``O`` tokens end, through
the next prompts of every client whose output was shorter (a share ``u``, its output's rank): ``(1 - k / B) + u``
times ``B - 1``, the sum of two uniforms (triangular on [0, 2]). The slowest :data:`WAVE_SHARE` of the wave (the p99
of the run's ``10 B`` requests) sit above ``2 - sqrt(2 (1 - WAVE_SHARE))`` = 1.55; steady-state requests decode
beside ``B - 1`` (1.0). Checked against a discrete-event simulation of the benchmark (prefill-first engine, lengths
in [0.8 L, L], 8K/1K; ``tests/test_inferencex.py::_closed_loop_tpots``): p99 / median TPOT 1.016, 1.055, 1.145, 1.177
at 4, 16, 64, 128 clients, where this gives 1.015, 1.062, 1.152, 1.197; InferenceX's aggregated 8K/1K runs measured
1.05, 1.11, 1.15, 1.14 (medians)."""


def _closed_tails(setup: Setup, st, batch, I, O, t_mean, t_wave, input_share, routed=0.0, idle=0.0) -> dict:
    """p99 TTFT, p99 TPOT and p50/p99 ITL (seconds) of a closed-loop benchmark run: TTFT's p99 is the later of the
    steady state's (at least its mean ``t_mean``) and the first wave's (``t_wave``: the request
    :data:`WAVE_SHARE` into the wave, delayed by the engine's one-time ``first_wave_s``); each request's TPOT is
    lognormal around the mean with the spread of the prompts it decodes beside (a closed loop of ``batch`` clients, lengths as the benchmark draws them) and of the
    drafts its steps accept, and the p99 request of the first wave decodes beside :data:`WAVE_PROMPTS` times the
    steady state's prompts (``input_share`` of the mean step): the two excesses over the mean add in quadrature
    (independent), with ``routed``, the p99 request's excess from the sequences a random router put beside it
    (:func:`_routing_excess`); ITL is a plain step or one carrying a prefill chunk (per emission)."""
    from planner.perf.latency import context_cv, itl_quantiles, tpot_cv
    from planner.perf.variants import spec_spread

    m, v, r = spec_spread(setup, np.broadcast_to(np.asarray(setup.spec_tokens, dtype=float), np.shape(st.step_s)), O)
    ctx = st.context_share * context_cv(I, O, BENCH_LENGTH_CV2, BENCH_LENGTH_CV2)
    cv = tpot_cv(input_share, batch, BENCH_LENGTH_CV2, O, m, v, closed=True, request_cv=r, context=ctx)
    plain, chunk, share = st.itl_steps
    i50, i99 = itl_quantiles(plain, chunk, share, (0.5, 0.99))
    shape = np.shape(st.step_s)
    return {k: np.array(np.broadcast_to(v, shape), dtype=float) for k, v in (
        ("ttft_p99", np.maximum(t_mean, t_wave + setup.eff.first_wave_s)),
        ("tpot_p99", _tpot_p99(st.step_s, cv, input_share, routed)), ("itl_p50", i50), ("itl_p99", i99),
        ("ttft_steady", t_mean), ("ttft_wave", t_wave), ("wave_idle", idle))}


def _tpot_p99(step_s, cv, input_share, routed=0.0):
    """p99 TPOT of a closed loop: the lognormal spread's excess over the mean ``step_s``, the first wave's
    (``(WAVE_PROMPTS - 1) input_share``) and the random router's (``routed``) in quadrature."""
    from planner.perf.latency import lognormal_quantile

    spread = lognormal_quantile(step_s, cv, 0.99) / step_s - 1.0
    wave = (WAVE_PROMPTS - 1.0) * np.clip(np.asarray(input_share, dtype=float), 0.0, 1.0)
    routed = np.maximum(np.asarray(routed, dtype=float), 0.0)
    return step_s * (1.0 + np.sqrt(np.maximum(spread, 0.0) ** 2 + wave ** 2 + routed ** 2))


def _routing_excess(setup: Setup, g: pd.DataFrame, Ld, B, I, O, st, workers, cap) -> np.ndarray | float:
    """Relative TPOT excess of the p99 request of a disaggregated closed loop whose router places requests on its
    ``workers`` decode workers at random (:func:`planner.calib.inferencex.random_decode_route`): the sequences
    beside it, averaged over its decode, are ``B`` plus a normal spread of :func:`planner.perf.latency.random_route_sd`
    (at most what the worker's KV ``cap`` holds), and its TPOT is the decode step at its p99 over the step at ``B``."""
    from planner.calib.inferencex import random_decode_route
    from planner.perf.latency import ndtri, random_route_sd

    if "n_framework" not in g.columns:
        return 0.0
    rnd = g["n_framework"].map(random_decode_route).to_numpy(bool) & (np.asarray(workers, dtype=float) > 1.0)
    if not rnd.any():
        return 0.0
    sd = random_route_sd(B * workers, workers)
    hi = np.where(rnd, np.minimum(B + float(ndtri(0.99)) * sd, np.maximum(cap, B)), B)
    return np.where(rnd, disagg_decode(setup, *Ld, hi, I, O).step_s / st.step_s - 1.0, 0.0)


def _role_setup(setup: Setup, g: pd.DataFrame, role: str) -> Setup:
    """``setup`` with the redundant expert slots of ``role``'s layout in ``g`` (expert weights held and
    streamed per chip grow by ``(E + R) / E``)."""
    moe = setup.model.architecture.moe
    col = f"{role}_red"
    if moe is None or col not in g.columns:
        return setup
    red = g[col].fillna(0.0).to_numpy(float)
    if not red.any():
        return setup
    return replace(setup, expert_copies=expert_copies(setup.model, red))


def _capacity(setup: Setup, g: pd.DataFrame, role: str, eng: str, tp=None) -> np.ndarray:
    """Sequences one ``role`` group (``a``gg, ``p``refill, ``d``ecode) holds in KV after its weights: a prefill
    group holds the prompt, the others what the engine admits on (``_held``); ``tp`` overrides the row's."""
    I = g["n_isl"].to_numpy(float)
    context = I if role == "p" else _held(eng, I, g["n_osl"].to_numpy(float))
    tp = g[f"{role}_tp"].to_numpy(float) if tp is None else tp
    setup = _role_setup(setup, g, role)
    return kv_capacity_sequences(setup, tp, *(g[f"{role}_{k}"].to_numpy(float) for k in ("ep", "pp", "dp")), context)


def _tuned(make, a: pd.DataFrame, eng: str):
    """(TTFT, TPOT) of the fastest-decoding of :data:`ASSUMED_VARIANTS` for rows that leave them open
    (a draft count the row records is kept)."""
    recorded = a["n_spec"].to_numpy(float)
    best_f = best_t = None
    for dp_attention, spec in ASSUMED_VARIANTS:
        v = a.assign(d_dp=a["d_tp"] * a["d_dp"], d_tp=1.0) if dp_attention else a
        f, t = _disagg(make(spec_tokens=np.where(np.isnan(recorded), spec, recorded)), v, eng)
        if best_t is None:
            best_f, best_t = f, t
        else:
            better = t < best_t
            best_f, best_t = np.where(better, f, best_f), np.where(better, t, best_t)
    return best_f, best_t


def _holding_layout(setup: Setup, a: pd.DataFrame, eng: str) -> pd.DataFrame:
    """Open rows whose recorded prefill or decode group cannot hold the model's weights with room for one
    sequence (e.g. DeepSeek-R1 recorded as "tp 1" on one 186 GB GPU) did not run as recorded: read
    each such group as the smallest power-of-two multiple of its tensor-parallel degree that does (and
    still divides the attention heads)."""
    a = a.copy()
    heads = float(setup.model.architecture.attention.heads)
    for role in ("p", "d"):
        tp = a[f"{role}_tp"].to_numpy(float)
        while True:
            short = (_capacity(setup, a, role, eng, tp) < 1.0) & (np.mod(heads, tp * 2.0) == 0)
            if not short.any():
                break
            tp = np.where(short, tp * 2.0, tp)
        a[f"{role}_tp"] = tp
    return a


def _think(g: pd.DataFrame, O, tpot_s) -> np.ndarray:
    """Time a client of a staggered closed loop is away from prefill (its decode, ``(O - 1) TPOT``); NaN for
    rows whose clients arrive together."""
    staggered = g["n_staggered"].fillna(False).to_numpy(bool) if "n_staggered" in g.columns else np.zeros(len(g), bool)
    return np.where(staggered, np.maximum(np.asarray(O, dtype=float) - 1.0, 0.0) * tpot_s, np.nan)


def _held(eng: str, I, O):
    return I + ADMIT_OUTPUT_SHARE.get(eng, 0.5) * O


def _agg(setup: Setup, g: pd.DataFrame, eng: str, tails: dict | None = None):
    """(TTFT, TPOT) in seconds of aggregated rows (``tails``: filled with their p99 and ITL, see
    :func:`_closed_tails`)."""
    setup = _role_setup(setup, g, "a")
    I = g["n_isl"].to_numpy(float)
    O = g["n_osl"].to_numpy(float)
    L = [g[f"a_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
    C = g["a_batch"].to_numpy(float)
    # Admission follows the engine's policy (``_held``). The planner itself reserves I + O per
    # sequence, so its plans never preempt.
    cap = kv_capacity_sequences(setup, *L, _held(eng, I, O))
    B = np.minimum(C, np.maximum(cap, 1.0))
    st = agg_decode(setup, *L, B, I, O, prompt_share=others_share(B))
    per_rank = B / L[3]
    adm = admission_wait(C, cap, O, st.step_s)
    t1 = ttft(setup, *L, I, per_rank, step_s=st.step_s, think_s=_think(g, O, st.step_s)) + adm
    if tails is not None:
        # the first wave: each rank prefills its share of the clients back to back, a prompt's prefill plus the
        # decode steps it rides (one per chunk)
        plain = st.itl_steps[0]
        unit = prefill_time(setup, *L, I, 1.0) + np.ceil(I / setup.prefill_chunk_tokens) * plain
        base = ttft(setup, *L, I, 1.0, step_s=st.step_s)
        share = np.clip(1.0 - plain / np.asarray(st.tokens_per_step) / st.step_s, 0.0, 1.0)
        # the replica prefills and decodes on the same GPUs: the wave reorders its work, it leaves none idle
        tails.update(_closed_tails(setup, st, B, I, O, t1, base + WAVE_SHARE * (per_rank - 1.0) * unit + adm, share))
    return t1, st.step_s


def _disagg(setup: Setup, g: pd.DataFrame, eng: str, tails: dict | None = None):
    """(TTFT, TPOT) in seconds of disaggregated rows (``tails``: as :func:`_agg`)."""
    pre, setup = _role_setup(setup, g, "p"), _role_setup(setup, g, "d")
    I = g["n_isl"].to_numpy(float)
    O = g["n_osl"].to_numpy(float)
    Ld = [g[f"d_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
    Lp = [g[f"p_{k}"].to_numpy(float) for k in ("tp", "ep", "pp", "dp")]
    Bd = g["d_batch"].to_numpy(float)
    kv_cap = kv_capacity_sequences(setup, *Ld, _held(eng, I, O))
    # Rows without worker counts: assume as many decode workers as it takes to hold the
    # concurrency in KV memory (nobody deploys fewer).
    assumed = g["n_workers_assumed"].to_numpy(bool)
    need = np.maximum(np.ceil(Bd / np.maximum(kv_cap, 1.0)), 1.0)
    Bd = np.where(assumed, Bd / need, Bd)
    B = np.minimum(Bd, np.maximum(kv_cap, 1.0))
    st = disagg_decode(setup, *Ld, B, I, O)
    d_workers = np.where(assumed, need, g["d_workers"].to_numpy(float))
    conc = g["n_conc"].fillna(pd.Series(Bd * d_workers, index=g.index)).to_numpy(float)
    cap1 = prefill_capacity_rps(pre, *Lp, I, 1.0)
    # Without recorded worker counts, also assume the prefill pool matches the decode pool's
    # request rate (a balanced deployment, as the planner itself would size it).
    rate = d_workers * B / (O * st.step_s)
    p_workers = np.where(assumed, np.maximum(np.ceil(rate / cap1), 1.0), g["p_workers"].to_numpy(float))
    cap = cap1 * p_workers
    B, st = decode_batch_fed_by_prefill(lambda b: disagg_decode(setup, *Ld, b, I, O), B, st, cap, O, d_workers)
    per_rank = conc / (p_workers * Lp[3])
    same = setup.hw.scale_up_domain_chips >= 72
    t1 = ttft(pre, *Lp, I, per_rank, transfer_s=kv_transfer_time(setup, I, same), think_s=_think(g, O, st.step_s),
              decode_step_s=st.step_s)
    adm = admission_wait(Bd, kv_cap, O, st.step_s)
    t1 = closed_loop_ttft(t1, conc, O, st.step_s, cap) + adm
    if tails is not None:
        # the first wave drains through the prefill pool at its capacity
        base = ttft(pre, *Lp, I, 1.0, transfer_s=kv_transfer_time(setup, I, same), decode_step_s=st.step_s)
        routed = _routing_excess(setup, g, Ld, B, I, O, st, d_workers, kv_cap)
        # the decode pool waits for the wave's prompts: its middle request's first token (the engine's one-time delay
        # included) is how long a client's decode capacity sits idle beyond the steady state's wait
        mid = base + 0.5 * conc / cap + adm + setup.eff.first_wave_s
        tails.update(_closed_tails(setup, st, B, I, O, t1, base + WAVE_SHARE * conc / cap + adm, 0.0, routed,
                                   np.maximum(mid - t1, 0.0)))
    return t1, st.step_s


def predict_frame(df: pd.DataFrame, catalog: Catalog, eff_for: EffFor | None = None) -> pd.DataFrame:
    """The input rows (silicon_calibration.csv columns) with ``predicted_ttft_ms``, ``predicted_tpot_ms``,
    ``predicted_output_tput_per_gpu`` and ``prediction_note`` added."""
    from planner.calib.data import normalise

    norm = normalise(df, catalog)
    pred = predict_normalised(norm, catalog, eff_for)
    out = df.copy()
    for col in ("predicted_ttft_ms", "predicted_tpot_ms", "predicted_output_tput_per_gpu"):
        out[col] = pred[col]
    out["prediction_note"] = notes(norm, pred, catalog, "silicon")
    return out


def predict_measured(meas, catalog: Catalog, eff_for: EffFor | None = None) -> pd.DataFrame:
    """Predictions for a :class:`planner.calib.data.Measured` file, as ``planner predict`` writes them:
    the silicon format keeps its columns and adds the predicted ones; an InferenceX file gives one row per
    run in file order (``run_index``, the predictions with their tails, and ``note``)."""
    pred = predict_normalised(meas.norm, catalog, eff_for)
    note = notes(meas.norm, pred, catalog, meas.fmt)
    if meas.fmt == "silicon":
        out = meas.raw.copy()
        for col in ("predicted_ttft_ms", "predicted_tpot_ms", "predicted_output_tput_per_gpu"):
            out[col] = pred[col]
        out["prediction_note"] = note
        return out
    return pd.DataFrame({
        "run_index": meas.raw["run_index"].to_numpy(),
        "predicted_ttft_ms": pred["predicted_ttft_ms"].to_numpy(),
        "predicted_tpot_ms": pred["predicted_tpot_ms"].to_numpy(),
        "predicted_output_tput_per_gpu": pred["predicted_output_tput_per_gpu"].to_numpy(),
        **{f"predicted_{k}_ms": pred[f"predicted_{k}_ms"].to_numpy() for k in TAILS},
        "note": note.to_numpy(),
    })


UNHELD_COLUMNS = {
    "silicon": "tp_size / attention_dp_size / moe_ep_size / pp_size",
    "inferencex": "*_tp / *_ep / *_dp_attention / num_*_gpu",
}


def notes(norm: pd.DataFrame, pred: pd.DataFrame, catalog: Catalog, fmt: str) -> pd.Series:
    """Why a row has no prediction, or what was assumed for it ("" when predicted as recorded)."""
    note = norm["reason"].copy()
    assumed = (note == "") & norm["n_workers_assumed"].astype(bool)
    note[assumed] = (
        "worker counts not recorded: assumed decode workers to hold the concurrency, rate-matched prefill, and the "
        "faster of TP/DP attention with and without speculative decoding"
    )
    odd = (note == "") & unsteady(norm)
    note[odd] = ("its concurrency sweep's TPOT falls as concurrency rises (not a steady state): scored here, left out "
                 "of the fit")
    unheld = pred["layout_cannot_hold"]
    note[unheld] = (
        "the recorded layout cannot hold " + norm.loc[unheld, "n_model"] + "'s weights and one sequence in "
        + norm.loc[unheld, "n_hw"] + f" HBM: check {UNHELD_COLUMNS[fmt]}"
    )
    known = norm["n_engine"].isin(list(catalog.engines) or ENGINES)
    other = (norm["reason"] == "") & ~known
    note[other] = note[other].where(note[other] == "", note[other] + "; ") + (
        "engine '" + norm.loc[other, "n_engine"].astype(str) + "' has no fitted factors: the hardware's default used"
    )
    return note


def finite_run_share(conc, requests, e2el_s, ttft_s, idle_s=0.0) -> np.ndarray:
    """Output throughput of a benchmark run of ``requests`` requests, ``conc`` in flight (a client takes the next
    request as one ends), over that of the steady closed loop (``conc`` requests always in flight, each taking
    ``e2el_s``): 1 where a row records no request count.

    The run lasts until its last request ends. Its ``k = requests / conc`` requests a client take ``k e2el_s`` plus
    the decode time the first wave leaves idle (``idle_s``: a disaggregated decode pool waits for the prompts released
    together, about the wave's middle first token beyond the steady TTFT; an aggregated replica only reorders its work,
    0), plus the drain: lengths drawn from the benchmark's range (:data:`BENCH_LENGTH_CV2`) put
    the clients out of step, so the run ends with the busiest client's last request. After ``k`` requests a client's
    lag is about ``sqrt(k)`` times a request's spread (``cv`` of its TTFT and decode parts, in quadrature), and the
    last of ``conc`` clients lags by the expected maximum of ``conc`` normals, ``z``; as a multiple of a request,
    ``x / sqrt(1 + x^2)`` with ``x = sqrt(k) cv z`` (the lags cannot exceed about one request: the client that ends
    first takes the next request). Against a simulation of the client (first come, first served over ``conc`` slots;
    ``tests/test_inferencex.py``) within 1.5% at 1-256 clients and ten requests a client for the benchmark's lengths;
    InferenceX's runs report 0.966, 0.966 and 0.970 of the steady value at 3-8, 9-32 and 33-128 clients (medians),
    where this gives 0.985, 0.971 and 0.962 at 4, 16 and 64 clients and a TTFT 5% of the request, before any idle
    wave (``python bench/finite_run.py``)."""
    conc, requests, e2el, ttft, idle = (np.asarray(v, dtype=float) for v in (conc, requests, e2el_s, ttft_s, idle_s))
    k = requests / np.maximum(conc, 1.0)
    c = np.maximum(conc, 1.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        lnc = np.log(np.maximum(c, 2.0))
        root = np.sqrt(2.0 * lnc)
        z = np.where(c >= 2.0, root - (np.log(lnc) + np.log(4.0 * np.pi)) / (2.0 * root), 0.0)
        t_share = np.clip(ttft / e2el, 0.0, 1.0)
        cv = np.sqrt(BENCH_LENGTH_CV2) * np.sqrt(t_share ** 2 + (1.0 - t_share) ** 2)
        x = np.sqrt(np.maximum(k, 0.0)) * cv * z
        drain = x / np.sqrt(1.0 + x * x)
        share = k / (k + drain + np.maximum(np.nan_to_num(idle), 0.0) / e2el)
    return np.where(np.isfinite(share) & (k > 0), share, 1.0)


def queued_run(norm: pd.DataFrame, catalog: Catalog, requests, eff_for: EffFor | None = None) -> pd.DataFrame:
    """Aggregated rows run as a benchmark that queues all ``requests`` at once, every request of the row's lengths
    (``trtllm-bench throughput`` on a synthetic dataset of zero length spread): output tokens/s per GPU over the run
    (``predicted_output_tput_per_gpu``), with the waves (``waves``: full ones, ``last_wave``: requests in the last).

    The engine runs ``c = min(concurrency, what its KV cache holds)`` requests at a time and admits the next as
    one ends; equal lengths keep them in step, so the run is ``floor(N / c)`` waves of ``c`` requests, each as long
    as a closed-loop request at ``c`` in flight (``TTFT + (O - 1) TPOT``), then one wave of the ``N mod c`` left.
    That wave's step is shorter but not in proportion to its batch (the weights stream whatever the batch), which
    is what a request count that is not a multiple of ``c`` costs. The TTFT and TPOT returned are the full waves'."""
    N = np.asarray(requests, dtype=float) * np.ones(len(norm))
    if not np.all(np.isfinite(N) & (N >= 1.0)):
        raise InputError(f"requests: {requests!r} is not a request count; give a whole number of at least 1")
    if (norm["n_mode"] != "agg").any():
        raise InputError("queued_run: disaggregated rows have no queued-run model; give aggregated rows (n_mode agg)")
    base = predict_normalised(norm, catalog, eff_for)
    conc = norm["n_conc"].astype(float).fillna(norm["a_batch"].astype(float)).to_numpy(float)
    c = np.maximum(np.floor(np.minimum(conc, base["predicted_held_sequences"].to_numpy(float))), 1.0)
    waves = np.floor(N / c)
    left = N - waves * c
    O = norm["n_osl"].to_numpy(float)

    def e2el(p: pd.DataFrame) -> np.ndarray:
        return (p["predicted_ttft_ms"].to_numpy(float) + np.maximum(O - 1.0, 0.0) * p["predicted_tpot_ms"].to_numpy(
            float)) / 1e3

    full = predict_normalised(norm.assign(n_conc=c, a_batch=c), catalog, eff_for)
    tail = 0.0
    if (left > 0).any():  # the last, partial wave (none where the count is a multiple of what fits)
        last = predict_normalised(norm.assign(n_conc=np.maximum(left, 1.0), a_batch=np.maximum(left, 1.0)), catalog,
                                  eff_for)
        tail = np.where(left > 0, e2el(last), 0.0)
    total = waves * e2el(full) + tail
    otpg = N * O / total / norm["n_gpus_out"].to_numpy(float)
    return pd.DataFrame({"predicted_output_tput_per_gpu": otpg, "predicted_ttft_ms": full["predicted_ttft_ms"],
                         "predicted_tpot_ms": full["predicted_tpot_ms"], "in_flight": c, "waves": waves,
                         "last_wave": left}, index=norm.index)


def log_residuals(norm: pd.DataFrame, catalog: Catalog, eff: EngineEfficiency, target: str,
                  weighted: bool = True) -> np.ndarray:
    """``log(predicted / measured)`` of ``norm``'s TPOT (``target`` "tpot") or TPOT and TTFT ("ttft") with every row
    predicted under ``eff``, times the square root of the rows' weight ``w`` where ``weighted`` (what the fits
    minimise: :mod:`planner.calib.fit`, :mod:`planner.calib.anchor`)."""
    def eff_for(_h: str, _e: str) -> EngineEfficiency:
        return eff

    pred = predict_normalised(norm, catalog, eff_for)
    # The TTFT factors are fitted on TPOT as well: prefill capacity feeds a disaggregated decode pool (a pool
    # starved by its prefill runs a smaller batch), so a prefill factor that TTFT alone would pick can break TPOT.
    pairs = [("predicted_tpot_ms", "m_tpot")] + ([("predicted_ttft_ms", "m_ttft")] if target == "ttft" else [])
    out = []
    for col, meas in pairs:
        r = np.log(pred[col].to_numpy(float) / norm[meas].to_numpy(float))
        r = np.nan_to_num(r, nan=0.0, posinf=5.0, neginf=-5.0)
        if weighted and "w" in norm.columns:
            r = r * np.sqrt(norm["w"].to_numpy(float))
        out.append(r)
    return np.concatenate(out)
