"""Serving-level predictions: TPOT and TTFT of aggregated and disaggregated deployments, with
queueing, tokens per second and cost.

Aggregated serving (prefill and decode on the same workers): in steady state ``B / O`` requests
finish per step and as many start, so every decode step also carries ``B * I / O`` prompt tokens
(chunked prefill). That is why measured TPOT grows with input length.

TTFT = fixed overhead + the prompt's own prefill + queueing. The queueing term is the work of the
requests ahead of it: with ``c`` requests in flight per rank, a new request waits behind
``queueing * (c - 1)`` others on average, where ``queueing`` is a fitted weight (0: requests never
collide; 0.5: every request arrives in a synchronised burst, as in a closed-loop benchmark that
starts all clients at once). Never report a TTFT without it.

Disaggregated serving: the prefill pool runs prompts on its own and ships the KV cache
(``I * kv_bytes_per_token``) to the decode pool over scale-up (same domain) or scale-out.
"""

from __future__ import annotations

import numpy as np

from planner.perf import params as P
from planner.perf.roofline import Setup, StepTimes, decode_step, prefill_time
from planner.units import HOUR_S, MS, MTOK, US


def agg_decode(setup: Setup, tp, ep, pp, dp, batch, input_tokens, output_tokens, new_tokens=None,
               prompt_share=1.0, plain: StepTimes | None = None) -> StepTimes:
    """Decode step of an aggregated worker at mean context ``I + O / 2`` with interleaved prefill of
    ``new_tokens`` per prompt (default ``I``; fewer when a cached prefix is reused), of ``prompt_share`` of the
    prompts that start while the batch decodes (see :func:`others_share`). ``plain``: see :func:`plain_decode`."""
    I = np.asarray(input_tokens, dtype=float)
    N = I if new_tokens is None else np.asarray(new_tokens, dtype=float)
    O = np.maximum(np.asarray(output_tokens, dtype=float), 1.0)
    B = np.asarray(batch, dtype=float) * np.asarray(prompt_share, dtype=float)
    # Requests finish (and as many start) ``tokens_per_step / O`` per sequence and step; each brings its N new
    # prompt tokens, taken whole or in chunks.
    return decode_step(
        setup, tp, ep, pp, dp, np.asarray(batch, dtype=float), I + O / 2.0,
        prefill_tokens_per_step=B * N * setup.tokens_per_step / O, prefill_context=I, prefill_prompt_tokens=N,
        plain=plain,
    )


def others_share(batch):
    """Share of the interleaved prompt work that a measured request's TPOT carries: ``(B - 1) / B``.

    A request's own prompt is in its TTFT, not in its TPOT: while it decodes its ``O`` tokens, the other
    ``B - 1`` sequences of a closed loop each finish and start once, so its decode steps carry their ``B - 1``
    prompts (one sequence alone carries none). A plan sizes steps with every prompt (share 1), which a
    request sees as a slightly slower step."""
    B = np.maximum(np.asarray(batch, dtype=float), 1.0)
    return (B - 1.0) / B


def disagg_decode(setup: Setup, tp, ep, pp, dp, batch, input_tokens, output_tokens,
                  plain: StepTimes | None = None) -> StepTimes:
    """Decode step of a disaggregated decode worker (no prefill interleaved). ``plain``: see :func:`plain_decode`."""
    I = np.asarray(input_tokens, dtype=float)
    O = np.asarray(output_tokens, dtype=float)
    return decode_step(setup, tp, ep, pp, dp, batch, I + O / 2.0, plain=plain)


def plain_decode(setup: Setup, tp, ep, pp, dp, batch, input_tokens, output_tokens) -> StepTimes:
    """The decode step of the same worker without drafts and without interleaved prompts: what speculative
    decoding prices its draft passes from. The aggregated and the disaggregated step of the same rows (at output
    lengths of at least one token) draft from the same one; a caller that evaluates both passes it to each
    (``plain``) instead of having it computed twice."""
    from dataclasses import replace

    return disagg_decode(replace(setup, spec_tokens=0.0), tp, ep, pp, dp, batch, input_tokens, output_tokens)


def ttft(setup: Setup, tp, ep, pp, dp, input_tokens, in_flight_per_rank, *, step_s=None, transfer_s=0.0,
         think_s=None, decode_step_s=None):
    """Mean time to first token (seconds) in a closed loop with ``in_flight_per_rank`` requests per prefill rank.

    ``overhead + expert overhead + t_pf + iteration + queueing * (c - 1) * (t_pf + t_step) + transfer`` (the
    expert overhead is ``prefill_expert_overhead_us`` per routed expert and MoE layer) where ``t_pf`` is the
    prompt's own prefill and ``c`` the requests in flight per rank. In aggregated serving (``step_s`` given) the
    prompt rides a decode iteration of ``t_step`` and waits the iterations of :func:`first_token_iterations`;
    each request ahead costs its prefill and the iteration it rides on. A dedicated prefill pool (no ``step_s``)
    spends ``t_pf`` per request ahead, and the first token then waits ``first_token_steps`` of the decode pool's
    steps (``decode_step_s``) to join its running batch.

    ``think_s`` (per row, NaN where not known) marks a closed loop whose clients are *staggered*: request
    lengths vary, so after the first wave the clients no longer arrive together, and each returns
    ``think_s`` after its first token (its decode). Its wait in queue is :func:`staggered_wait` in place of
    the fitted burst term.
    """
    e = setup.eff
    t_pf = prefill_time(setup, tp, ep, pp, dp, input_tokens, 1.0)
    c = np.maximum(np.asarray(in_flight_per_rank, dtype=float), 1.0)
    if step_s is None:
        unit = t_pf
        iteration = 0.0 if decode_step_s is None else e.first_token_steps * np.asarray(decode_step_s, dtype=float)
    else:
        step = np.asarray(step_s, dtype=float)
        unit = t_pf + step
        iteration = first_token_iterations(e, dp) * step
    s = setup.stats
    fixed = e.ttft_overhead_ms * MS + e.prefill_expert_overhead_us * US * s.moe_layers * s.experts
    wait = e.queueing * (c - 1.0) * unit
    if think_s is not None:
        think = np.asarray(think_s, dtype=float)
        wait = np.where(np.isnan(think), wait, staggered_wait(t_pf, c, np.nan_to_num(think)))
    return fixed + t_pf + iteration + wait + transfer_s


def first_token_iterations(e, dp):
    """Decode iterations an aggregated worker's new request spends besides its prefill before its first token
    reaches the client: it arrives mid-iteration (half a step), its prefill rides the next iteration with the
    decode batch, the engine's scheduler hands the token over ``first_token_steps`` iterations later, and
    under attention data parallelism (``dp > 1``) the engine may hold it ``attn_dp_wait_steps`` iterations to
    balance the ranks."""
    return 1.5 + e.first_token_steps + np.where(np.asarray(dp, dtype=float) > 1, e.attn_dp_wait_steps, 0.0)


def staggered_wait(service_s, clients, think_s):
    """Mean wait in queue at one prefill rank of ``clients`` closed-loop clients that arrive staggered.

    Each client returns ``think_s`` after its prompt is served, so the rank sees ``lambda = c / (think + t + W)``
    requests per second, ``t`` the prefill work of one prompt and ``W`` the wait itself: the closed loop slows its
    own arrivals as the queue grows. Spread out, they queue as an M/D/1 system at ``rho = lambda t``:
    ``W = rho t / (2 (1 - rho))``. The two together are a quadratic in ``W``,
    ``2 W^2 + 2 W (think + t - c t) - c t^2 = 0``, whose positive root goes from the open queue's ``rho t / 2`` at
    light load to Little's law's ``c t - think - t`` where the rank saturates (every client then waits its turn
    behind the others' prompts, ``lambda -> 1 / t``). A closed loop never waits behind more than the other ``c - 1``
    prompts."""
    t = np.asarray(service_s, dtype=float)
    c = np.maximum(np.asarray(clients, dtype=float), 1.0)
    b = np.asarray(think_s, dtype=float) + t - c * t
    root = np.sqrt(b * b + 2.0 * c * t * t)
    # the positive root, in the form that does not cancel when the think time dwarfs the prompts (b >> 0)
    w = np.where(b > 0.0, c * t * t / np.maximum(root + b, 1e-300), 0.5 * (root - b))
    return np.minimum(w, (c - 1.0) * t)


def ttft_base(setup: Setup, tp, ep, pp, dp, input_tokens, step_s, t_pf=None):
    """(TTFT without queueing, prefill work per request) of an aggregated replica under open arrivals, in
    seconds: the fixed overheads, the prompt's own prefill ``t_pf``, and the iterations it waits for
    (:func:`first_token_iterations`). Queueing behind other prompts comes on top, from the arrival rate (see
    ``perf.candidates.planned_load``), each prompt occupying its rank for ``t_pf``. ``t_pf``: the prompt's
    prefill where the caller has it already (``prefill_time(setup, tp, ep, pp, dp, input_tokens, 1.0)``)."""
    e = setup.eff
    if t_pf is None:
        t_pf = prefill_time(setup, tp, ep, pp, dp, input_tokens, 1.0)
    step = np.asarray(step_s, dtype=float)
    s = setup.stats
    fixed = e.ttft_overhead_ms * MS + e.prefill_expert_overhead_us * US * s.moe_layers * s.experts
    return fixed + t_pf + first_token_iterations(e, dp) * step, t_pf


def prefill_capacity_rps(setup: Setup, tp, ep, pp, dp, input_tokens, workers=1.0):
    """Requests per second a prefill pool of ``workers`` replicas sustains (every DP rank busy, and
    ``pp`` prompts in flight through the pipeline)."""
    dp_ = np.asarray(dp, dtype=float)
    t = prefill_time(setup, tp, ep, pp, dp, input_tokens, dp_)
    return np.asarray(workers, dtype=float) * dp_ * np.asarray(pp, dtype=float) / t


def closed_loop_ttft(ttft_s, concurrency, output_tokens, tpot_s, capacity_rps):
    """Little's law for a closed loop of ``concurrency`` clients: when prefill capacity caps the request
    rate, TTFT is ``C / capacity - O * TPOT`` (the wait piles up in front of prefill)."""
    C = np.asarray(concurrency, dtype=float)
    floor = C / np.asarray(capacity_rps, dtype=float) - np.asarray(output_tokens, dtype=float) * tpot_s
    return np.maximum(ttft_s, floor)


def decode_batch_fed_by_prefill(step_of, batch, step: StepTimes, capacity_rps, output_tokens, decode_workers,
                                iterations: int = 8):
    """(batch, step) of a disaggregated decode worker whose prefill pool caps the request rate.

    In a closed loop the decode pool holds ``lambda * O * TPOT`` sequences (Little's law), ``lambda`` at most
    the prefill pool's ``capacity_rps``: when prefill is the bottleneck the clients wait in front of prefill
    and each decode worker runs fewer sequences than the concurrency suggests (and a faster step). ``batch``
    is the batch before that limit and ``step`` its step (``step_of(batch)``); TPOT grows with the batch, so
    ``B = min(batch, capacity * O * TPOT(B) / workers)`` is reached from above by fixed-point iteration (a
    decreasing sequence to its largest solution)."""
    B0 = np.asarray(batch, dtype=float)
    per_worker = np.asarray(capacity_rps, dtype=float) * np.asarray(output_tokens, dtype=float) / np.asarray(
        decode_workers, dtype=float)
    B = B0
    for _ in range(iterations):
        fed = np.minimum(B0, np.maximum(per_worker * step.step_s, 1.0))
        if np.allclose(fed, B, rtol=1e-3):
            break
        B = fed
        step = step_of(B)
    return B, step


def kv_transfer_time(setup: Setup, input_tokens, same_domain: bool | np.ndarray = False):
    """Time to ship one prompt's KV cache from the prefill to the decode pool (per chip link)."""
    b = P.kv_bytes_per_sequence(setup.model, input_tokens, setup.kv_dtype)
    bw = np.where(same_domain, setup.hw.scale_up_bw, setup.hw.scale_out_bw)
    return b / (bw * setup.eff.prefill_comm_bandwidth)


def kv_capacity_sequences(setup: Setup, tp, ep, pp, dp, context):
    """Sequences of ``context`` tokens whose KV cache fits in one replica's HBM after weights and the
    runtime reserve (the most a replica can run at once; more requests wait for a free slot)."""
    from planner.perf.layout import kv_bytes_per_chip, runtime_reserve_bytes, weight_bytes_per_chip

    free = setup.hw.hbm_bytes - runtime_reserve_bytes(setup.hw) - weight_bytes_per_chip(setup.wb, tp, ep, pp, dp)
    per_seq = kv_bytes_per_chip(setup.model, 1.0, context, setup.kv_dtype, tp, pp, dp, setup.sliding_kv_share)
    return np.maximum(free, 0.0) / per_seq


def admission_wait(concurrency, capacity, output_tokens, tpot_s):
    """Extra TTFT when ``concurrency`` exceeds the ``capacity`` a replica can hold: by Little's law the
    surplus requests wait ``(C / capacity - 1) * O * TPOT`` for a slot."""
    C = np.asarray(concurrency, dtype=float)
    cap = np.maximum(np.asarray(capacity, dtype=float), 1.0)
    return np.maximum(C / cap - 1.0, 0.0) * np.asarray(output_tokens, dtype=float) * tpot_s


def tokens_per_s(step: StepTimes, batch):
    """Output tokens per second of one replica."""
    return np.asarray(batch, dtype=float) / step.step_s


def usd_per_mtok(usd_per_hour, tokens_per_second):
    """Dollars per million tokens at ``tokens_per_second``."""
    return np.asarray(usd_per_hour, dtype=float) / (np.asarray(tokens_per_second, dtype=float) * HOUR_S) * MTOK
