"""Production techniques in the performance model: worked numbers and identities (ideal mode unless stated)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.catalog.schemas import IDEAL, EngineEfficiency
from planner.perf.candidates import planned_load, queue_wait
from planner.perf.layout import Layout, check_layout, describe_layout
from planner.perf.roofline import (
    Setup,
    _stage_parts,
    accepted_tokens,
    decode_step,
    expected_max_normal,
    expert_load_imbalance,
    gemm_efficiency,
    prefill_parts,
    prefill_time,
)
from tests.conftest import load_bench


def test_redundant_experts_make_wide_ep_degrees_valid(catalog):
    """EP72 and EP144 with 32 redundant slots for DeepSeek's 256 experts, EP96 with 96 for Kimi's 384: the
    degree divides experts + redundant, not the experts alone."""
    ds, kimi = catalog.models["deepseek-v3"], catalog.models["kimi-k2"]
    check_layout(ds, Layout(1, 72, 1, 72, 32))
    check_layout(ds, Layout(1, 144, 1, 144, 32))
    check_layout(kimi, Layout(1, 96, 1, 96, 96))
    from planner.errors import InputError

    with pytest.raises(InputError, match="--redundant-experts 32"):
        check_layout(ds, Layout(1, 72, 1, 72, 0))
    with pytest.raises(InputError, match="256 experts \\+ 8 redundant"):
        check_layout(ds, Layout(1, 72, 1, 72, 8))
    assert describe_layout(1, 72, 1, 72, 32) == "attn-DP72 EP72 +32 redundant"
    assert describe_layout(8, 1, 2, 1) == "TP8 PP2"


def test_accepted_tokens_per_draft_position():
    """1 + a1 + a1 a2 + a1 a2 a3, the last acceptance repeating (DeepSeek-V3's catalog values)."""
    acc = (0.875, 0.616)
    assert accepted_tokens(3, acc) == pytest.approx(1 + 0.875 + 0.875 * 0.616 + 0.875 * 0.616**2)
    assert accepted_tokens(0, acc) == pytest.approx(1.0)
    assert accepted_tokens(np.array([1.0, 2.0]), 0.5).tolist() == pytest.approx([1.5, 1.75])


def test_engine_acceptance_share_scales_every_draft(catalog):
    m, hw = catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"]
    eff = IDEAL.model_copy(update={"spec_accept_scale": 0.5})
    s = Setup.make(m, hw, eff=eff, spec_tokens=2)
    assert float(s.tokens_per_step) == pytest.approx(1 + 0.4375 + 0.4375 * 0.308)


def test_expert_load_imbalance_of_random_routing(catalog):
    """4 tokens x 8 experts over 8 EP ranks: 32 activations, mean 4 a rank, sd sqrt(4 x 7/8); the busiest of 8
    ranks sits z_8 = 1.42 sd above (Blom), i.e. 1.67x the mean. Large batches average it away; tensor-parallel
    experts (one rank) have none."""
    s = Setup.make(catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"], eff=IDEAL)
    z8 = float(expected_max_normal(8))
    assert z8 == pytest.approx(1.4236, abs=0.015)  # exact expected maximum of 8 standard normals: 1.4236
    assert float(expert_load_imbalance(s, 8, 4)) == pytest.approx(1 + z8 * np.sqrt(4 * 7 / 8) / 4)
    assert float(expert_load_imbalance(s, 8, 100_000)) == pytest.approx(1.0, abs=0.01)
    assert float(expert_load_imbalance(s, 1, 4)) == 1.0
    # At most every activation on one rank.
    assert float(expert_load_imbalance(s, 64, 1)) <= 64.0


def test_small_batch_ep_is_slower_than_tp_experts(catalog):
    """At 4 sequences the busiest EP8 rank streams about twice its share of experts; TP-split experts share
    every expert's bytes evenly, so TP8 EP8 decodes slower than TP8 with experts split by TP."""
    s = Setup.make(catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"], eff=IDEAL)
    ep = decode_step(s, 8, 8, 1, 1, 4, 2000)
    tp = decode_step(s, 8, 1, 1, 1, 4, 2000)
    assert float(ep.gemm_memory_s) > 1.5 * float(tp.gemm_memory_s)


def test_gemm_efficiency_follows_the_gemm_rows():
    eff = EngineEfficiency(compute=0.6, compute_fp8=0.7, gemm_half_tokens=16)
    assert float(gemm_efficiency(eff, "bf16", 16)) == pytest.approx(0.3)
    assert float(gemm_efficiency(eff, "fp8", 48)) == pytest.approx(0.7 * 48 / 64)
    assert float(gemm_efficiency(eff, "fp4", 1e9)) == pytest.approx(0.6, rel=1e-6)  # no FP4 factor: compute
    assert float(gemm_efficiency(EngineEfficiency(compute=0.5), "bf16", 1)) == pytest.approx(0.5)  # flat


def test_two_micro_batch_overlap_identity(catalog):
    """With overlap a stage pass is two half micro-batches on SGLang's DeepSeek decode schedule: each one's dispatch
    under its shared experts and the other's attention projections, its combine under the other's attention core and
    output projection, its routed experts with nothing in flight. Hand-assembled from the half batch's parts:
    ``2 (experts + max(dispatch, other GEMMs) + max(combine, attention + o_proj))``, dispatch and combine split by
    bytes (FP8 out, bf16 back: 1/3 and 2/3); never faster than ``2 max(work, comm)`` (perfect overlap), never slower
    than no overlap. Weights are streamed once per micro-batch."""
    from planner.perf.roofline import _o_proj_share

    m, hw = catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"]
    s = Setup.make(m, hw, weights="fp8", eff=IDEAL, tbo=1.0)
    B, S = 72 * 128.0, 2000.0
    st = decode_step(s, 1, 72, 1, 72, B, S)
    half = _stage_parts(s, 1.0, 72.0, 1.0, 72.0, B / 2, S, 0.0, 0.0)
    gemm = max(float(half.gemm_c), float(half.gemm_m))
    attn = max(float(half.attn_c), float(half.attn_m))
    expert, exchange = float(half.expert), float(half.exchange)
    assert 0 < expert < gemm and 0 < exchange <= float(half.comm)
    # DeepSeek-V3: o_proj is 128 x 128 x 7168 of each layer's ~231M non-expert GEMM parameters (and the dense layers')
    o = (gemm - expert) * _o_proj_share(s)
    assert 0.3 < _o_proj_share(s) < 0.6
    staged = expert + max(exchange / 3, gemm - expert - o) + max(2 * exchange / 3, attn + o)
    staged += float(half.comm) - exchange + float(half.layer_overhead)
    assert float(st.step_s) == pytest.approx(2 * staged)
    assert 2 * max(gemm + attn, float(half.comm)) <= float(st.step_s) <= 2 * (gemm + attn + float(half.comm))
    plain = decode_step(replace(s, tbo=0.0), 1, 72, 1, 72, B, S)
    assert float(st.weight_read_bytes) == pytest.approx(2 * float(plain.weight_read_bytes), rel=0.02)
    # At this batch the exchange across nodes is large: hiding it pays.
    assert float(st.step_s) < float(plain.step_s)


def test_prefill_overlap_hides_the_expert_exchange(catalog):
    """A prefill pass with two micro-batch overlap takes max(compute, memory, comm) + 2 overheads; without,
    the sum; overlap applies only to expert-parallel layouts with attention data parallelism."""
    m, hw = catalog.models["deepseek-v3"], catalog.hardware["h100-sxm"]
    s = Setup.make(m, hw, weights="fp8", kv="fp8", eff=hw.efficiency.default)
    args = (1, 32, 1, 32, 4096.0, 128.0)
    comp, mem, comm, over = (float(x) for x in prefill_parts(s, *args))
    plain = float(prefill_time(s, *args))
    tbo = float(prefill_time(replace(s, tbo=1.0), *args))
    assert plain == pytest.approx(max(comp, mem) + comm + over)
    assert tbo == pytest.approx(max(comp, mem, comm) + 2 * over)
    assert comm > 0 and tbo < plain
    # pure tensor parallelism has no exchange to hide: the flag changes nothing
    assert float(prefill_time(replace(s, tbo=1.0), 8, 8, 1, 1, 4096.0, 8.0)) == pytest.approx(
        float(prefill_time(s, 8, 8, 1, 1, 4096.0, 8.0)))


def test_prefill_pass_in_ideal_mode_is_its_flops(catalog):
    """A dense model's prefill of one prompt on one GPU in ideal mode: 2 P n + causal attention over peak."""
    from planner.perf import params as P

    m, hw = catalog.models["llama-3.1-8b"], catalog.hardware["h100-sxm"]
    s = Setup.make(m, hw, eff=IDEAL)
    comp, mem, comm, over = prefill_parts(s, 1, 1, 1, 1, 4096, 1)
    flops = 2 * s.nonexpert_matmul_params * 4096
    att = float(P.prefill_attention_flops(m, 4096))
    assert float(comp) == pytest.approx(flops / hw.flops("bf16") + att / hw.flops("bf16"))
    assert float(comm) == 0 and float(over) == 0


def test_queue_wait_is_md1_for_one_server():
    """M/D/1: Wq = rho / (2 (1 - rho)) x service."""
    assert float(queue_wait(0.5, 1, 0.2)) == pytest.approx(0.5 / (2 * 0.5) * 0.2)
    assert float(queue_wait(0.0, 4, 0.2)) == 0.0
    assert float(queue_wait(0.9, 8, 0.2)) < float(queue_wait(0.9, 1, 0.2))


def test_planned_load_meets_the_ttft_target():
    """The rate a row is planned for is the highest whose TTFT under Poisson arrivals meets the target, within
    the utilisation cap; a cap of 1 is a valid cap, and a row whose idle TTFT misses the target gets none."""
    import pandas as pd

    rows = pd.DataFrame({"capacity_rps": [20.0, 20.0, 20.0], "ttft_base_s": [0.5, 0.5, 1.2],
                         "queue_work_s": [0.1, 0.1, 0.1], "queue_servers": [1.0, 1.0, 1.0]})
    lam, t = planned_load(rows, 1.0, 1.0)
    # slack 0.5 s = rho / (2 (1 - rho)) x 0.1 -> rho = 10 / 11
    assert lam[0] == pytest.approx(10 / 11 / 0.1, rel=1e-6)
    assert t[0] == pytest.approx(1.0, rel=1e-6)
    lam_cap, _ = planned_load(rows, 1.0, 0.3)
    assert lam_cap[0] == pytest.approx(0.3 * 20.0)
    assert np.isnan(lam[2])


def test_published_production_deployments_are_predicted_within_a_band():
    """Regression guard on the fitted catalog (bench/production_check.py prints the figures): DeepSeek's H800
    decode at 20 tokens/s per user and its prefill, and LMSYS's H100 prefill, predicted from their published
    layouts. A refit that lets a factor wander where benchmark rows do not pin it (attention efficiency at
    5k-token contexts) would plan these fleets twice too large; that fails here."""
    from planner.catalog import load_catalog

    mod = _production_check()
    res = {c["case"]: c["ratio"] for c in mod.cases(load_catalog(Path(__file__).resolve().parents[1] / "catalogs"))}
    assert 0.75 <= res["ds6-decode"] <= 1.5
    assert 0.7 <= res["ds6-prefill"] <= 1.5
    assert all(0.5 <= res[f"lmsys-prefill-{k}k"] <= 1.5 for k in (1, 2, 4))
    # every published case (GB200 wide EP, TensorRT-LLM's B200/H200 runs and perf overview, PaLM on TPU v4) is
    # predicted: a finite, positive ratio
    assert len(res) >= 35 and all(np.isfinite(v) and v > 0 for v in res.values())


def test_first_token_waits_engine_iterations_in_both_serving_modes(catalog):
    """``first_token_steps`` adds that many decode iterations to TTFT: an aggregated worker's own steps (in the
    closed-loop and the open-arrival form alike), a disaggregated request's decode-pool steps, and in a plan's
    prefill row the workload's TPOT target, the longest step its decode pool may run."""
    from planner.catalog.scenario import Workload
    from planner.perf.candidates import evaluate_point
    from planner.perf.serving import ttft, ttft_base

    m, hw = catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"]
    eff = hw.efficiency.for_engine("sglang")
    s0 = Setup.make(m, hw, eff=eff.model_copy(update={"first_token_steps": 0.0}))
    s3 = Setup.make(m, hw, eff=eff.model_copy(update={"first_token_steps": 3.0}))
    lay = (8.0, 8.0, 1.0, 1.0)
    step = 0.02
    a0 = float(ttft(s0, *lay, 1024.0, 16.0, step_s=step))
    a3 = float(ttft(s3, *lay, 1024.0, 16.0, step_s=step))
    assert a3 - a0 == pytest.approx(3 * step)
    b0, w0 = ttft_base(s0, *lay, 1024.0, step)
    b3, w3 = ttft_base(s3, *lay, 1024.0, step)
    assert float(b3 - b0) == pytest.approx(3 * step) and float(w3) == pytest.approx(float(w0))
    d0 = float(ttft(s0, *lay, 1024.0, 16.0, decode_step_s=0.05))
    d3 = float(ttft(s3, *lay, 1024.0, 16.0, decode_step_s=0.05))
    assert d3 - d0 == pytest.approx(3 * 0.05)
    assert float(ttft(s3, *lay, 1024.0, 16.0)) == pytest.approx(d0)  # no decode step given: no join term
    w = Workload(name="w", requests_per_s=1.0, input_tokens=1024, output_tokens=256,
                 slo={"ttft_ms": 2000, "tpot_ms": 40})
    rows = [evaluate_point(m, hw, Layout(8, 8, 1, 1), 1, w, "prefill", weights="fp8", kv="fp8", eff=e)
            for e in (s0.eff, s3.eff)]
    assert rows[1]["ttft_base_s"] - rows[0]["ttft_base_s"] == pytest.approx(3 * 0.040)


def test_measured_runs_are_evaluated_with_their_attention_dp_balance(catalog):
    """A measured run that records whether its attention-DP ranks balance their prompts (``n_adp_balance``) is
    evaluated so; one that does not takes its engine's (TensorRT-LLM: balanced, as its export configures it). One
    rank's prompt stalling the others makes the step slower than balanced ranks."""
    import pandas as pd

    from planner.calib.predict import predict_normalised

    row = _production_check().benchmark_row("deepseek-v3", "h200-sxm", "trtllm", dense="fp8", expert="fp8", kv="fp8",
                                            isl=1024, osl=2048, conc=512, tp=1, ep=8, dp=8)
    df = pd.DataFrame([{**row, "n_adp_balance": v} for v in (None, True, False)])
    p = predict_normalised(df, catalog)["predicted_tpot_ms"].to_numpy()
    assert p[0] == pytest.approx(p[1], rel=1e-12) and p[2] > p[1] * 1.01
    row.pop("n_adp_balance")
    plain = predict_normalised(pd.DataFrame([row]), catalog)["predicted_tpot_ms"].to_numpy()
    assert plain[0] == pytest.approx(p[1], rel=1e-12)


def test_trtllm_bench_batch_heuristic_worked_numbers(catalog):
    """The batch limit trtllm-bench picks when a command gives none (bench/production_check.py mirrors
    ``calc_engine_setting``): Llama 3.x 70B FP8 on two H200 at 1K/1K: KV 2 x 80 layers x max(2, 8) heads x 128 x 1 byte
    = 163,840 B a token, 0.3125 GiB a 2,048-token request; (2 x 141 GiB - 70.6e9 elements x 1 B) x 0.95 = 205.4 GiB
    -> 657 requests -> rounded up to 128s: 768, and 1,314 tokens a step -> the floor of 2,048. DeepSeek's MLA is
    charged as 128 heads of 7168 / 128 = 56 elements, so 8 B200 at 1K/8K get 64-96 a rank; an MXFP4 checkpoint has no
    heuristic (2,048 and 8,192)."""
    mod = _production_check()
    gib = 1024.0**3
    w = mod.weight_bytes(catalog.models["llama-3.1-70b"], "fp8", "fp8")
    stored = w.nonexpert + (w.embed + w.lm_head) / 2.0 + w.expert
    per_request = 2 * 80 * 8 * 128 * 1.0 * 2048 / gib
    requests = (2 * 141.0 - stored / gib) * 0.95 / per_request
    assert 640 < requests < 680
    args = dict(dense="fp8", expert="fp8", kv="fp8", pp=1)
    assert mod.trtllm_bench_settings(catalog, "llama-3.1-70b", "h200-sxm", quant="fp8", tp=2, isl=1024, osl=1024,
                                     **args) == (768, 2048)
    assert mod.trtllm_bench_settings(catalog, "deepseek-v3", "h200-sxm", quant="fp8", tp=8, isl=1024, osl=8192,
                                     **args) == (64, 2048)
    assert mod.trtllm_bench_settings(catalog, "deepseek-v3", "b200-sxm", quant="nvfp4", tp=4, isl=1024, osl=1024,
                                     **{**args, "expert": "fp4"}) == (384, 2048)
    assert mod.trtllm_bench_settings(catalog, "gpt-oss-120b", "h200-sxm", quant="mxfp4", tp=1, isl=1024, osl=1024,
                                     **{**args, "dense": "bf16", "expert": "fp4"}) == (2048, 8192)
    # deepseek-ai/DeepSeek-R1-0528 records no KV format: the heuristic charges 2 bytes an element though the run keeps
    # FP8 KV, 142 requests at 1K/1K on 8 H200 -> 160 a rank (384 at 1 byte)
    assert mod.trtllm_bench_settings(catalog, "deepseek-v3", "h200-sxm", quant="fp8", tp=8, isl=1024, osl=1024,
                                     **args) == (384, 2048)
    assert mod.trtllm_bench_settings(catalog, "deepseek-v3", "h200-sxm", quant="fp8", tp=8, isl=1024, osl=1024,
                                     checkpoint_kv="bf16", **args) == (160, 2048)


def _production_check():
    """``bench/production_check.py`` as a module (its cases and its benchmark rows)."""
    return load_bench("production_check")


def test_queued_run_is_waves_of_what_fits_and_a_partial_last_one(catalog):
    """A benchmark that queues every request at once with equal lengths (``trtllm-bench throughput``) runs in waves of
    ``c = min(concurrency, what the KV cache holds)``: a request count that is a multiple of ``c`` gives the steady
    closed loop's output rate at ``c`` in flight exactly; ``N = k c + r`` adds one wave of ``r`` requests, shorter
    than a full one (its step is smaller) but not in proportion (weights stream whatever the batch), so the run's
    rate falls below the steady one and above ``k + 1`` full waves'. A concurrency above what the cache holds runs
    as many as it holds."""
    import pandas as pd

    from planner.calib.predict import predict_normalised, queued_run

    mod = _production_check()
    row = mod.benchmark_row("llama-3.1-70b", "h200-sxm", "trtllm", dense="fp8", expert="fp8", kv="fp8", isl=1024,
                            osl=1024, conc=256, tp=2, ep=1, dp=1)
    df = pd.DataFrame([row])
    base = predict_normalised(df, catalog).iloc[0]
    held = float(base["predicted_held_sequences"])
    assert 256 < held < 2000  # the cache holds the 256 in flight
    e2el = (base["predicted_ttft_ms"] + 1023.0 * base["predicted_tpot_ms"]) / 1e3
    steady = 256 * 1024.0 / e2el / 2.0
    whole = queued_run(df, catalog, 4 * 256).iloc[0]
    assert (whole["waves"], whole["in_flight"], whole["last_wave"]) == (4, 256, 0)
    assert whole["predicted_output_tput_per_gpu"] == pytest.approx(steady, rel=1e-9)
    assert base["predicted_output_tput_per_gpu"] == pytest.approx(steady, rel=1e-9)
    part = queued_run(df, catalog, 4 * 256 + 32).iloc[0]
    last = predict_normalised(df.assign(n_conc=32.0, a_batch=32.0), catalog).iloc[0]
    e_last = (last["predicted_ttft_ms"] + 1023.0 * last["predicted_tpot_ms"]) / 1e3
    assert 0.0 < e_last < e2el and e_last > e2el * 32 / 256  # shorter, not in proportion
    assert part["predicted_output_tput_per_gpu"] == pytest.approx((4 * 256 + 32) * 1024.0 / (4 * e2el + e_last) / 2.0,
                                                                  rel=1e-9)
    assert (4 * 256 + 32) * 1024.0 / (5 * e2el) / 2.0 < part["predicted_output_tput_per_gpu"] < steady
    # more clients than the cache holds: the engine runs what it holds
    over = queued_run(df.assign(n_conc=4 * held, a_batch=4 * held), catalog, 10 * held).iloc[0]
    assert over["in_flight"] == np.floor(held)
