"""``planner simulate``: a discrete-event simulation of a plan's pools, to check its latency formulas.

Requests arrive as a Poisson stream at each workload's demand, with prompt and output lengths drawn from the
workload's spread. The router sends each to an aggregated or prefill pool in proportion to the traffic the plan
gives the pool (disaggregated requests then to a decode pool the same way), and to one of the pool's replicas at
random (a random split of a Poisson stream is Poisson). Each replica is simulated request by request:

- **Admission**: a request holds one of the replica's ``batch`` slots from admission to its last token (an
  aggregated replica) or from the hand-over to its last token (a decode replica); it waits while all are held.
- **Prefill**: first come, first served on the replica's ``prefill_servers`` ranks; a prompt ``x`` times the mean
  length holds a rank ``x`` times the mean prefill work. Its first token comes the pool's fixed overheads and
  iteration waits later (``ttft_base_s - prefill_work_s``); a disaggregated request's then waits for a decode slot.
- **Decode**: each prompt prefilled on an aggregated replica delays every sequence decoding there by its chunk
  steps (``x`` times the mean prompt's share of the step, as the performance model prices it), so a request's
  TPOT is the plain step plus the prompts that actually arrived while it decoded, over its tokens. With
  speculative decoding each step yields 1 + the accepted drafts (each accepted with the probability that gives
  the plan's tokens per step), drawn per request; and each request's steps carry the engine's step-time noise
  averaged over them (:data:`planner.perf.latency.STEP_NOISE`).
- **ITL**: the steps a request sees are plain or carry a prefill chunk, in the share the prompts around it make.

Step times come from the plan (the performance model's numbers for each pool at its batch); the simulation
checks the queueing, the routing, the slot limits and the tails, not the step physics.

**Warm-up**: the replicas start empty, so each workload's stream begins a few of its pools' relaxation times before
the requests it measures (:func:`warm_up`; at least a tenth of them, at most as many again); the measured requests
see the steady state the plan's formulas describe.

**Sampling error**: the requests of a loaded queue are not independent (a long prompt delays the ones behind it for
a whole busy period), so a share of requests within a target scatters across seeds far more than ``n`` independent
draws would (a long-context plan at 50,000 requests: 88.6% to 96.0% over four seeds). Each share therefore carries
the half-width of its 95% confidence interval by the method of batch means (:func:`share_halfwidth`: the requests
in arrival order cut into consecutive batches whose shares are nearly independent; Law and Kelton, *Simulation
Modeling and Analysis*, section 9.5.3). A batch is at least one relaxation time of the slowest queue the requests
pass (:func:`relaxation_s`), so that near saturation, where a queue remembers its state for hundreds of requests,
the interval widens with fewer batches instead of treating correlated batches as independent.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from planner.errors import InputError
from planner.results.schema import SCHEMA_VERSION, Plan

BATCHES = 20
"""Batches of the method of batch means (:func:`share_halfwidth`) where the queues relax quickly: 10-30 is the usual
range; fewer widens the Student t quantile, more shortens each batch. A batch is never shorter than the queue's
relaxation time (:func:`relaxation_s`), which can leave fewer."""


@dataclass
class SimResult:
    """Per request: workload, entry pool, decode pool ('' for aggregated), TTFT, TPOT and the ITL samples."""

    workload: np.ndarray
    pool: np.ndarray
    decode_pool: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    itl: dict
    """(workload, pool) -> (plain ITL, chunk ITL, share of chunk steps) over the simulated requests."""


def fcfs(arrivals: np.ndarray, services: np.ndarray, servers: int, slots: int | None = None,
         hold: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(service start, admission) of requests in arrival order at ``servers`` first-come-first-served servers;
    with ``slots``, a request is admitted only while fewer than ``slots`` requests are held, each held from its
    admission for ``hold`` after its service ends."""
    n = len(arrivals)
    start = np.empty(n)
    admit = np.empty(n)
    free = [0.0] * max(int(servers), 1)
    held: list[float] = []
    cap = None if slots is None else max(int(slots), 1)
    for i in range(n):
        t = arrivals[i]
        if cap is not None and len(held) >= cap:
            t = max(t, heapq.heappop(held))
        admit[i] = t
        s = max(t, free[0])
        start[i] = s
        heapq.heapreplace(free, s + services[i])
        if cap is not None:
            heapq.heappush(held, s + services[i] + hold[i])
    return start, admit


def slot_wait(ready: np.ndarray, hold: np.ndarray, slots: int) -> np.ndarray:
    """When each request (sorted by ``ready``) gets one of ``slots`` slots it then holds for ``hold``."""
    n = len(ready)
    got = np.empty(n)
    held: list[float] = []
    cap = max(int(slots), 1)
    for i in range(n):
        t = ready[i]
        if len(held) >= cap:
            t = max(t, heapq.heappop(held))
        got[i] = t
        heapq.heappush(held, t + hold[i])
    return got


def _accept_for(tokens_per_step: float, spec: int) -> float:
    """The per-draft acceptance ``a`` with ``1 + a + ... + a^spec = tokens_per_step`` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        if 1.0 + sum(a ** j for j in range(1, spec + 1)) < tokens_per_step:
            lo = a
        else:
            hi = a
    return lo


def _spec_factor(rng, out_tokens: np.ndarray, tokens_per_step: float, spec: int) -> np.ndarray:
    """Per request, its steps times the mean tokens per step over its tokens (1 without drafts): the factor its
    TPOT differs from the mean by, from its own acceptance (drawn around the mean with the spread across requests,
    :data:`planner.perf.latency.SPEC_REQUEST_SPREAD`) and the drafts each of its steps accepts. The plan's TPOT is the
    mean over requests, so the factor is scaled to mean 1 over the spread of acceptance (a request's TPOT goes as
    ``1 / m(own)``, convex: unscaled, its mean ran 0.3% above the plan's and the simulated p90 with it)."""
    if spec <= 0 or tokens_per_step <= 1.0:
        return np.ones(len(out_tokens))
    from planner.perf.latency import SPEC_REQUEST_SPREAD, spec_step_spread

    a = _accept_for(tokens_per_step, spec)
    mean0 = float(spec_step_spread(spec, a)[0])
    # each request's own acceptance, and the mean and variance of its tokens per step (on a grid: one evaluation)
    own = np.clip(a + rng.normal(0.0, SPEC_REQUEST_SPREAD, size=len(out_tokens)), 0.0, 0.999)
    grid = np.linspace(0.0, 0.999, 201)
    gm, gv = (np.array(x, dtype=float) for x in zip(*(spec_step_spread(spec, g) for g in grid), strict=True))
    mean, var = np.interp(own, grid, gm), np.interp(own, grid, gv)
    steps_mean = out_tokens / mean
    # steps to emit O tokens (renewal count): mean O / m, variance O var / m^3
    steps = np.maximum(rng.normal(steps_mean, np.sqrt(out_tokens * var / mean ** 3)), 1.0)
    # E[m(a) / m(own)] over own ~ N(a, spread) clipped as drawn: Gauss-Hermite (probabilists') nodes
    z, wz = np.polynomial.hermite_e.hermegauss(24)
    jensen = float(np.sum(wz * mean0 / np.interp(np.clip(a + SPEC_REQUEST_SPREAD * z, 0.0, 0.999), grid, gm))
                   / np.sum(wz))
    return steps * mean0 / out_tokens / jensen


def _request_factor(rng, out_tokens: np.ndarray, tokens_per_step: float, spec: int) -> np.ndarray:
    """Per request, the factor its TPOT differs from the pool's mean by: its drafts (:func:`_spec_factor`) times the
    step-time noise averaged over its steps (lognormal of mean 1 and coefficient of variation
    :func:`planner.perf.latency.step_noise_cv`, as the plan's TPOT quantiles take it)."""
    from planner.perf.latency import step_noise_cv

    cv = step_noise_cv(out_tokens, max(tokens_per_step, 1.0))
    s2 = np.log1p(cv * cv)
    noise = np.exp(rng.normal(-s2 / 2.0, np.sqrt(s2)))
    return _spec_factor(rng, out_tokens, tokens_per_step, spec) * noise


def _lengths(rng, spread, n: int) -> np.ndarray:
    """``n`` lengths over their mean, drawn from a workload's spread (all 1 without one)."""
    if spread is None:
        return np.ones(n)
    if spread.points is not None:
        pts = np.asarray(spread.points, dtype=float)
        w = pts[:, 1] / pts[:, 1].sum()
        return pts[rng.choice(len(pts), size=n, p=w), 0] / spread.mean
    from planner.perf.latency import lognormal_sigma

    s = lognormal_sigma(spread.mean, spread.p90)
    return np.exp(rng.normal(-s * s / 2.0, s, size=n))


def simulate(plan: Plan, requests: int = 100_000, seed: int = 0) -> SimResult:
    """Simulate ``requests`` requests over the plan's workloads (split by demand) through its pools."""
    if plan.schema_version != SCHEMA_VERSION:
        raise InputError(f"plan schema {plan.schema_version} is not {SCHEMA_VERSION}: re-plan with `planner plan`")
    rng = np.random.default_rng(seed)
    demand = np.array([w.requests_per_s for w in plan.workloads], dtype=float)
    counts = np.maximum(np.round(requests * demand / demand.sum()).astype(int), 1)
    cols: dict[str, list] = {k: [] for k in ("workload", "pool", "decode_pool", "ttft", "tpot")}
    itl: dict = {}
    for w, n in zip(plan.workloads, counts, strict=True):
        _simulate_workload(plan, w, int(n), rng, cols, itl, warm=warm_up(plan, w, int(n)))
    return SimResult(*(np.concatenate(cols[k]) if cols[k] else np.array([]) for k in cols), itl)


WARM_RELAXATIONS = 2.0
"""Each workload's stream starts this many of its slowest pool's relaxation times before the requests it measures
(see :func:`warm_up`)."""


def warm_up(plan: Plan, w, n: int) -> int:
    """Requests simulated before the ``n`` that are measured, so that the queues are near their steady state (the one
    the plan's formulas describe) when measuring starts: a replica starts empty, and its queue fills over a few
    relaxation times, each about a request's hold on its resource (a prefill rank's work, a batch slot's admission
    to last token) over ``1 - u`` at utilisation ``u``; without it a pool of a rare workload (a long-context one
    with ~80 requests a replica) measured its start-up and its p99 TTFT came out 28% short of the steady state
    (``bench/percentiles.py``). At least a tenth of ``n``, at most ``n``."""
    relax = 0.0
    for p in plan.pools:
        if p.workload != w.name:
            continue
        pr, lt = p.predicted, p.predicted.latency
        decode = w.output_tokens * pr.tpot_s
        hold = {"prefill": lt.prefill_work_s, "decode": decode}.get(p.role, lt.ttft_base_s + decode)
        relax = max(relax, hold / max(1.0 - min(pr.utilisation, 0.95), 0.05))
    return int(min(n, max(n // 10, math.ceil(WARM_RELAXATIONS * relax * w.requests_per_s))))


def relaxation_s(plan: Plan, w, pool: str | None = None) -> float:
    """Relaxation time in seconds of the slowest queue a request of workload ``w`` passes (of ``pool`` alone where
    given): the time over which a replica's queue forgets its state, so that shares of requests measured that far
    apart are nearly independent.

    A replica's queues are a prefill queue (``prefill_servers`` servers, each holding a mean prompt
    ``prefill_work_s``) and, for an aggregated or decode pool, its ``batch`` slots (each held from admission to the
    last token). A queue of ``c`` servers each holding a request ``h`` at occupancy ``rho`` (the replica's request
    rate times ``h`` over ``c``) relaxes in ``h / (c (1 - sqrt(rho))^2)``, the M/M/1 relaxation time
    ``1 / (mu (1 - sqrt(rho))^2)`` (Cohen, *The Single Server Queue*; Morse 1955) with the ``c`` servers as one of
    ``c`` times the rate, and never in less than one hold: about ``4 h / (c (1 - rho)^2)`` near saturation, hundreds
    of holds at ``rho`` 0.9 on one server, where the plan's formulas still meet their targets."""
    longest = 0.0
    for p in plan.pools:
        if p.workload != w.name or (pool is not None and p.id != pool):
            continue
        pr, lt = p.predicted, p.predicted.latency
        queues = []
        if p.role in ("prefill", "aggregated") and lt.prefill_work_s > 0:
            queues.append((lt.prefill_work_s, max(round(lt.prefill_servers), 1)))
        if p.role in ("decode", "aggregated"):
            base = lt.ttft_base_s - lt.prefill_work_s if p.role == "aggregated" else 0.0
            queues.append((w.output_tokens * pr.tpot_s + max(base, 0.0), max(p.batch, 1)))
        for hold, c in queues:
            rho = min(pr.requests_per_s_per_replica * pr.utilisation * hold / c, 0.999)
            longest = max(longest, hold, hold / (c * (1.0 - math.sqrt(max(rho, 0.0))) ** 2))
    return longest


def _carried(p) -> float:
    return p.predicted.requests_per_s * p.predicted.utilisation


def _pick(rng, pools, n) -> np.ndarray:
    share = np.array([_carried(p) for p in pools], dtype=float)
    return rng.choice(len(pools), size=n, p=share / share.sum())


def _simulate_workload(plan: Plan, w, n: int, rng, cols: dict, itl: dict, warm: int = 0) -> None:
    """Simulate ``warm + n`` requests of workload ``w`` through its pools and record the last ``n``."""
    total = n + warm
    arrivals = np.cumsum(rng.exponential(1.0 / w.requests_per_s, size=total))
    x = _lengths(rng, w.input_spread, total)
    out = np.maximum(np.round(_lengths(rng, w.output_spread, total) * w.output_tokens), 1.0)
    entry = [p for p in plan.pools if p.workload == w.name and p.role in ("aggregated", "prefill")]
    decode = [p for p in plan.pools if p.workload == w.name and p.role == "decode"]
    if not entry:
        raise InputError(f"workload {w.name}: the plan has no pool that takes its prompts")
    which = _pick(rng, entry, total)
    ttft, tpot = np.zeros(total), np.zeros(total)
    dec_of = np.full(total, "", dtype=object)
    handover: list[tuple[np.ndarray, np.ndarray]] = []
    for k, p in enumerate(entry):
        idx = np.flatnonzero(which == k)
        replica = rng.integers(0, p.replicas, size=idx.size)
        for r in range(p.replicas):
            mine = idx[replica == r]
            if not mine.size:
                continue
            t1, t2, chunk = _replica(rng, p, arrivals[mine], x[mine], out[mine], float(w.output_tokens))
            ttft[mine] = t1 - arrivals[mine]
            if p.role == "aggregated":
                tpot[mine] = t2
                plain, ch = p.predicted.latency.itl.p50, p.predicted.latency.itl.p99
                acc = itl.setdefault((w.name, p.id), [plain, max(plain, ch), []])
                acc[2].append(chunk[mine >= warm])
            else:
                handover.append((mine, t1))
    if handover:
        if not decode:
            raise InputError(f"workload {w.name}: the plan prefills it in a pool but has no decode pool")
        mine = np.concatenate([m for m, _ in handover])
        ready = np.concatenate([t for _, t in handover])
        dsel = _pick(rng, decode, mine.size)
        for k, p in enumerate(decode):
            sel = np.flatnonzero(dsel == k)
            rep = rng.integers(0, p.replicas, size=sel.size)
            spec = _request_factor(rng, out[mine[sel]], p.tokens_per_step, p.spec_tokens)
            step = p.predicted.tpot_s * spec
            for r in range(p.replicas):
                s2 = sel[rep == r]
                if not s2.size:
                    continue
                order = np.argsort(ready[s2], kind="stable")
                s2 = s2[order]
                got = slot_wait(ready[s2], out[mine[s2]] * step[np.searchsorted(sel, s2)], p.batch)
                req = mine[s2]
                ttft[req] += got - ready[s2]
                tpot[req] = step[np.searchsorted(sel, s2)]
                dec_of[req] = p.id
            itl.setdefault((w.name, p.id), [p.predicted.tpot_s * p.tokens_per_step] * 2 + [[np.zeros(1)]])
    cols["workload"].append(np.full(n, w.name, dtype=object))
    cols["pool"].append(np.array([entry[k].id for k in which[warm:]], dtype=object))
    cols["decode_pool"].append(dec_of[warm:])
    cols["ttft"].append(ttft[warm:])
    cols["tpot"].append(tpot[warm:])


def _replica(rng, p, arrivals: np.ndarray, x: np.ndarray, out: np.ndarray, mean_out: float):
    """(first-token times, TPOT per request, share of chunk steps each saw) of one replica of an aggregated or
    prefill pool."""
    lt = p.predicted.latency
    work, base = lt.prefill_work_s, lt.ttft_base_s
    service = work * x
    tpot_mean = p.predicted.tpot_s
    if p.role == "prefill":
        start, _ = fcfs(arrivals, service, round(lt.prefill_servers))
        return start + service + (base - work), None, None
    hold = out * tpot_mean + (base - work)
    start, _ = fcfs(arrivals, service, round(lt.prefill_servers), slots=p.batch, hold=hold)
    first = start + service + (base - work)
    # Decode: the plain step, plus the delay of each prompt prefilled while the request decodes. The model prices
    # a mean prompt at ``input_share * tpot`` per token over the ``O / B`` steps a prompt arrives in at full batch,
    # i.e. ``input_share * tpot * O / B`` of delay to every running sequence; a prompt x times longer, x times that.
    share = p.input_share
    plain = tpot_mean * (1.0 - share)
    per_prompt = share * tpot_mean * mean_out / max(p.batch, 1)
    order = np.argsort(start, kind="stable")
    s_sorted, cum = start[order], np.concatenate([[0.0], np.cumsum(x[order])])
    end = first + out * tpot_mean
    lo, hi = np.searchsorted(s_sorted, first, side="left"), np.searchsorted(s_sorted, end, side="right")
    prompts = cum[hi] - cum[lo]
    spec = _request_factor(rng, out, p.tokens_per_step, p.spec_tokens)
    tpot = (plain + prompts * per_prompt / out) * spec
    # the share of its steps that carry a chunk: the design's share (B prompts over a request's O steps at full
    # batch) scaled by the prompts it actually saw
    expected = max(p.batch, 1) * out / mean_out
    chunk = np.clip(lt.chunk_share * prompts / np.maximum(expected, 1e-30), 0.0, 1.0)
    return first, tpot, chunk


def t_halfwidth(values) -> float:
    """Half-width of the 95% confidence interval of the mean of nearly independent ``values`` (Student's t with
    ``n - 1`` degrees of freedom); 0 for a single value."""
    from scipy.stats import t as student

    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return 0.0
    return float(student.ppf(0.975, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))


def share_halfwidth(ok: np.ndarray, batches: int = BATCHES, correlated: float = 0.0) -> float:
    """Half-width of the 95% confidence interval of ``ok.mean()`` (``ok``: per request in arrival order, whether it
    met a target) by the method of batch means: :func:`t_halfwidth` of the shares of consecutive equal batches,
    ``batches`` of them, or fewer where a batch would be shorter than ``correlated`` requests (the requests that
    arrive within the queue's relaxation time, :func:`relaxation_s`). NaN with fewer than two requests a batch or
    fewer than two batches (a run too short to say how far its share may be from the steady state's)."""
    ok = np.asarray(ok, dtype=float)
    k = max(ok.size // batches, math.ceil(correlated))
    n = ok.size // max(k, 1)
    if k < 2 or n < 2:
        return float("nan")
    return t_halfwidth(ok[: k * n].reshape(n, k).mean(axis=1))


def summary(plan: Plan, res: SimResult) -> list[dict]:
    """Per workload and pool: simulated p50/p90/p99 of TTFT, TPOT and ITL and the share meeting each target and
    both (goodput), beside the plan's predictions."""
    rows = []
    slo = {w.name: w for w in plan.workloads}
    pools = {p.id: p for p in plan.pools}
    for wname in dict.fromkeys(res.workload):
        w = slo[wname]
        m = res.workload == wname
        keys = [("(all)", m)] + [(pid, m & ((res.pool == pid) | (res.decode_pool == pid)))
                                 for pid in dict.fromkeys(np.concatenate([res.pool[m], res.decode_pool[m]])) if pid]
        for pid, sel in keys:
            if not sel.any():
                continue
            p = pools.get(pid)
            tt, tp = res.ttft[sel], res.tpot[sel]
            row = {"workload": wname, "pool": pid, "requests": int(sel.sum())}
            first = p is None or p.role != "decode"
            last = p is None or p.role != "prefill"
            for name, v, ok in (("ttft", tt, first), ("tpot", tp, last)):
                for q in (50, 90, 99):
                    row[f"{name}_p{q}_ms"] = float(np.percentile(v, q)) * 1e3 if ok else None
            ok_t, ok_p = tt <= w.slo_ttft_s * (1 + 1e-9), tp <= w.slo_tpot_s * (1 + 1e-9)
            # requests of this row that arrive within its slowest queue's relaxation time
            correlated = relaxation_s(plan, w, None if p is None else pid) * w.requests_per_s * sel.sum() / m.sum()
            for key, ok in (("ttft_within", ok_t), ("tpot_within", ok_p), ("goodput", ok_t & ok_p)):
                row[key] = float(np.mean(ok))
                hw = share_halfwidth(ok, correlated=correlated)
                row[f"{key}_ci"] = None if np.isnan(hw) else hw  # None: too few requests for batch means (JSON-safe)
            if p is not None:
                lt = p.predicted.latency
                if first:
                    row.update(pred_ttft_p50_ms=lt.ttft.p50 * 1e3, pred_ttft_p90_ms=lt.ttft.p90 * 1e3,
                               pred_ttft_p99_ms=lt.ttft.p99 * 1e3)
                if last:
                    row.update(pred_tpot_p50_ms=lt.tpot.p50 * 1e3, pred_tpot_p90_ms=lt.tpot.p90 * 1e3,
                               pred_tpot_p99_ms=lt.tpot.p99 * 1e3)
                    acc = res.itl.get((wname, pid))
                    if acc is not None:
                        share = float(np.mean(np.concatenate(acc[2]))) if acc[2] else 0.0
                        for q in (50, 90, 99):
                            row[f"itl_p{q}_ms"] = (acc[1] if share > 1 - q / 100 else acc[0]) * 1e3
            else:
                row.update(pred_ttft_attainment=w.ttft_attainment, pred_tpot_attainment=w.tpot_attainment,
                           pred_goodput=w.goodput, slo_ttft_quantile=w.slo_ttft_quantile,
                           slo_tpot_quantile=w.slo_tpot_quantile, slo_goodput=w.slo_goodput)
            rows.append(row)
    return rows
