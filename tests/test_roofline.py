"""Ideal-mode identities of design.md section 3 (within 2%) and worked numbers."""

from __future__ import annotations

import math

import pytest

from planner.catalog.schemas import IDEAL
from planner.errors import InputError
from planner.perf.layout import Layout, check_layout, kv_bytes_per_chip, weight_bytes_per_chip
from planner.perf.report import balance_batch, roofline
from planner.perf.roofline import Setup, decode_step, latency_floor

DENSE = [("llama-3.1-70b", "h100-sxm", "bf16"), ("llama-3.1-8b", "b200-sxm", "fp8"), ("qwen3-32b", "mi355x", "fp4")]


def ideal(catalog, mid, hid, weights=None, kv="bf16"):
    return Setup.make(catalog.models[mid], catalog.hardware[hid], weights=weights, kv=kv, eff=IDEAL)


@pytest.mark.parametrize("mid,hid,w", DENSE)
def test_tpot_at_batch_one_is_the_weight_stream(catalog, mid, hid, w):
    s = ideal(catalog, mid, hid, w)
    st = decode_step(s, 1, 1, 1, 1, 1, 0)
    floor = float(latency_floor(s, 1, 1, 1, 1))
    # Every resident byte but the input-embedding table (a row gather) is streamed once per step.
    assert float(st.step_s) == pytest.approx(s.streamed_nonexpert_bytes / s.hw.hbm_bw, rel=1e-9)
    assert float(st.step_s) >= floor * (1 - s.wb.embed / s.wb.total) - 1e-12
    assert float(st.step_s) <= floor


@pytest.mark.parametrize("mid,hid,w", DENSE + [("deepseek-v3", "gb200-nvl72", "fp8"), ("kimi-k2", "b200-sxm", "fp8")])
def test_balance_batch_rule(catalog, mid, hid, w):
    """Balance batch (compute = weight time, zero context) = F * b / (2 W) * P / P_a."""
    s = ideal(catalog, mid, hid, w)
    b_star = balance_batch(s, Layout(), 0.0)
    F = s.hw.flops(w)
    bw = s.wb.dense_bytes_per_weight
    # P / P_a in the streamed-bytes / matmul-FLOPs sense (all experts touched at a batch this large).
    P_streamed = (s.streamed_nonexpert_bytes + s.wb.expert) / bw
    rule = F * bw / (2 * s.hw.hbm_bw) * P_streamed / s.stats.matmul_active_params
    assert b_star == pytest.approx(rule, rel=0.02)


def test_balance_batch_is_about_300_on_h100_bf16(catalog):
    s = ideal(catalog, "llama-3.1-70b", "h100-sxm", "bf16")
    assert balance_batch(s, Layout(), 0.0) == pytest.approx(989 / 3.35, rel=0.02)


def test_moe_balance_batch_scales_with_sparsity(catalog):
    """DeepSeek-V3: about 300 x 671/37 ~ 5,000 sequences on H100-class ratios."""
    s = ideal(catalog, "deepseek-v3", "h100-sxm", "fp8")
    b = balance_batch(s, Layout(), 0.0)
    dense_rule = s.hw.flops("fp8") * 1.0 / (2 * s.hw.hbm_bw)
    assert 0.7 * dense_rule * 671 / 37.5 < b < 1.3 * dense_rule * 671 / 37.5


@pytest.mark.parametrize("mid,hid,w", [("llama-3.1-405b", "h100-sxm", "fp8"), ("deepseek-v3", "b200-sxm", "fp8")])
def test_pipeline_saves_weights_not_kv(catalog, mid, hid, w):
    s = ideal(catalog, mid, hid, w)
    per_chip_batch = 64.0
    base = Layout(tp=8, ep=8 if s.stats.experts else 1)
    rows = []
    for pp in (1, 2, 4, 8):
        lay = Layout(tp=base.tp, ep=base.ep, pp=pp)
        batch = per_chip_batch * lay.chips / base.chips
        w_chip = float(weight_bytes_per_chip(s.wb, lay.tp, lay.ep, lay.pp, lay.dp))
        kv_chip = float(kv_bytes_per_chip(s.model, batch, 4096, s.kv_dtype, lay.tp, lay.pp, lay.dp))
        tpot = float(decode_step(s, lay.tp, lay.ep, lay.pp, lay.dp, batch, 4096).step_s)
        rows.append((pp, w_chip, kv_chip, tpot))
    w1, kv1, t1 = rows[0][1:]
    for pp, w_chip, kv_chip, tpot in rows[1:]:
        assert w_chip == pytest.approx(w1 / pp, rel=0.02)
        assert kv_chip == pytest.approx(kv1, rel=0.02)
        assert tpot == pytest.approx(t1, rel=0.02)


@pytest.mark.parametrize("mid,hid,w", DENSE)
def test_unbatched_cost_ratio_is_the_balance_batch(catalog, mid, hid, w):
    s = ideal(catalog, mid, hid, w)
    b = balance_batch(s, Layout(), 0.0)
    c1 = float(decode_step(s, 1, 1, 1, 1, 1, 0).step_s) / 1
    cb = float(decode_step(s, 1, 1, 1, 1, b, 0).step_s) / b
    assert c1 / cb == pytest.approx(b, rel=0.02)


def test_kv_overtakes_weights_at_long_context(catalog):
    s = ideal(catalog, "llama-3.1-70b", "h100-sxm", "bf16")
    short = decode_step(s, 8, 1, 1, 1, 32, 1000)
    long = decode_step(s, 8, 1, 1, 1, 32, 100_000)
    assert float(short.attn_memory_s) < float(short.gemm_memory_s)
    assert float(long.attn_memory_s) > float(long.gemm_memory_s)


def test_expert_all_to_all_leaves_the_domain_on_hgx(catalog):
    """EP 64 inside an NVL72 rack vs across eight 8-GPU nodes (worked numbers, ideal mode).

    Each GPU sends its 64 tokens (4096 over 64 ranks) to their 8 experts: FP8 dispatch plus bf16 combine,
    7168 x 3 B a copy. Inside the rack all 8 copies ride NVLink (900 GB/s), 63/64 of them off-chip. Across
    nodes a decode step runs latency kernels (DeepEP low-latency): every copy goes point to point to its
    expert's GPU, so the 8 x 56/64 copies whose experts sit on other nodes cross InfiniBand (50 GB/s) and the
    8 x 7/64 to the node's other GPUs ride NVLink. A prefill pass runs throughput kernels (DeepEP normal): a
    token crosses InfiniBand once per remote node it is routed to, and DeepSeek-V3's node-limited routing
    (4 of 8 groups, one group a node) reaches at most 4 nodes, 4 (1 - (3/4)^8) = 3.60 expected, 7/8 of them
    remote; inside each node the copies are forwarded over NVLink.
    """
    from dataclasses import replace

    from planner.perf.roofline import ep_exchange_time

    m = catalog.models["deepseek-v3"]
    rack = Setup.make(m, catalog.hardware["gb200-nvl72"], eff=IDEAL)
    hgx = Setup.make(m, catalog.hardware["b200-sxm"], eff=IDEAL)
    a = decode_step(rack, 1, 64, 1, 64, 4096, 2000)
    b = decode_step(hgx, 1, 64, 1, 64, 4096, 2000)
    per_copy = 7168 * 3.0
    layers = 58
    assert float(a.comm_s) == pytest.approx(layers * 64 * 8 * per_copy * (63 / 64) / 900e9, rel=1e-9)
    ib = 64 * 8 * (56 / 64) * per_copy / 50e9
    nvlink = 64 * 8 * (7 / 64) * per_copy / 900e9
    assert float(b.comm_s) == pytest.approx(layers * max(ib, nvlink), rel=1e-9)
    assert float(b.comm_s) > 5 * float(a.comm_s)
    # Throughput kernels (prefill) send a token once per remote node: node-limited routing bounds the nodes.
    normal = float(ep_exchange_time(hgx, 64.0, 4096.0, layers, 0.0))
    remote = 4 * (1 - 0.75**8) * 7 / 8
    forward = 64 * 8 * per_copy * (7 / 8) / 900e9
    assert normal == pytest.approx(layers * max(64 * remote * per_copy / 50e9, forward), rel=1e-9)
    assert normal < float(b.comm_s)
    # Without node-limited routing a token reaches any of the 8 nodes: 8 (1 - (7/8)^8) = 5.25 expected.
    free = m.model_copy(update={"architecture": m.architecture.model_copy(
        update={"moe": m.architecture.moe.model_copy(update={"groups": 1, "groups_per_token": 1})})})
    c = float(ep_exchange_time(replace(hgx, model=free), 64.0, 4096.0, layers, 0.0))
    assert c == pytest.approx(layers * 64 * 8 * (1 - (7 / 8) ** 8) * (7 / 8) * per_copy / 50e9, rel=1e-9)
    # Latency kernels copy per expert whatever the routing groups: node-limited routing does not shrink decode.
    assert float(decode_step(replace(hgx, model=free), 1, 64, 1, 64, 4096, 2000).comm_s) == pytest.approx(
        float(b.comm_s))


def test_mla_kv_is_replicated_across_tp(catalog):
    m = catalog.models["deepseek-v3"]
    assert float(kv_bytes_per_chip(m, 64, 4096, "bf16", 8, 1, 1)) == pytest.approx(
        float(kv_bytes_per_chip(m, 64, 4096, "bf16", 1, 1, 1))
    )
    assert float(kv_bytes_per_chip(m, 64, 4096, "bf16", 1, 1, 8)) == pytest.approx(
        float(kv_bytes_per_chip(m, 64, 4096, "bf16", 1, 1, 1)) / 8
    )


def test_roofline_result_fields(catalog):
    s = ideal(catalog, "llama-3.1-70b", "h100-sxm", "bf16")
    r = roofline(s, Layout(tp=8), 64, 2048, mode="ideal", engine=None)
    assert r.chips == 8 and r.fits
    assert r.step_time_s >= max(r.compute_time_s, r.memory_time_s) * 0.999
    assert r.usd_per_hour == pytest.approx(8 * 1.69)
    assert r.usd_per_mtok == pytest.approx(r.usd_per_hour / (r.tokens_per_s * 3600) * 1e6)
    big = roofline(s, Layout(tp=1), 512, 128_000, mode="ideal", engine=None)
    assert not big.fits


@pytest.mark.parametrize(
    "mid,lay,pattern",
    [
        ("llama-3.1-70b", Layout(tp=128), "tp 128 exceeds the 64 attention heads"),
        ("llama-3.1-70b", Layout(tp=48), "does not divide the 64 attention heads"),
        ("llama-3.1-70b", Layout(tp=8, ep=8), "dense"),
        ("deepseek-v3", Layout(tp=8, ep=6), "does not divide the 256 experts"),
        ("deepseek-v3", Layout(tp=2, ep=4), "must divide tp x dp"),
    ],
)
def test_invalid_layouts(catalog, mid, lay, pattern):
    with pytest.raises(InputError, match=pattern):
        check_layout(catalog.models[mid], lay)


def test_sequence_and_expert_overheads_are_exact_increments(catalog):
    """seq_overhead_us adds its value per sequence on each attention-DP rank per step; the prefill expert
    overhead adds its value per routed expert and MoE layer to TTFT, and nothing for a dense model."""
    from planner.catalog.schemas import EngineEfficiency
    from planner.perf.serving import ttft

    hw = catalog.hardware["h100-sxm"]
    base = EngineEfficiency(compute=0.5, memory=0.8, layer_overhead_us=10.0)
    more = base.model_copy(update={"seq_overhead_us": 7.0, "prefill_expert_overhead_us": 3.0})
    m = catalog.models["deepseek-v3"]
    s0, s1 = Setup.make(m, hw, weights="fp8", eff=base), Setup.make(m, hw, weights="fp8", eff=more)
    B, dp, pp = 96.0, 4.0, 2.0
    d = decode_step(s1, 2, 8, pp, dp, B, 2048).step_s - decode_step(s0, 2, 8, pp, dp, B, 2048).step_s
    # pp stages each carry B / pp sequences spread over dp ranks
    assert float(d) == pytest.approx(pp * 7e-6 * (B / pp) / dp, rel=1e-9)
    st = s0.stats
    t = ttft(s1, 8, 8, 1, 1, 1024, 1) - ttft(s0, 8, 8, 1, 1, 1024, 1)
    assert float(t) == pytest.approx(3e-6 * st.moe_layers * st.experts, rel=1e-9)
    dense = catalog.models["llama-3.1-70b"]
    d0, d1 = Setup.make(dense, hw, eff=base), Setup.make(dense, hw, eff=more)
    assert float(ttft(d1, 8, 1, 1, 1, 1024, 1)) == pytest.approx(float(ttft(d0, 8, 1, 1, 1, 1024, 1)), rel=1e-12)


def test_hbm_capacity_is_the_binary_marketed_size(catalog):
    """Marketed HBM sizes are GiB: 80 GiB on H100, 180 GiB usable on B200 (stored in GB = 1e9 B)."""
    assert catalog.hardware["h100-sxm"].hbm_bytes == pytest.approx(80 * 2**30, rel=2e-3)
    assert catalog.hardware["b200-sxm"].hbm_bytes == pytest.approx(180 * 2**30, rel=2e-3)


def test_ep_with_tp_attention_exchanges_like_expert_tp(catalog):
    """With tensor-parallel attention (dp = 1) every chip holds every token: experts split by EP run
    on them locally and the output rides the all-reduce, so communication equals expert TP's and no
    all-to-all is paid; with attention DP the all-to-all appears."""
    from planner.catalog.schemas import EngineEfficiency

    eff = EngineEfficiency(compute=0.5, memory=0.8, collective_latency_us=20.0)
    s = Setup.make(catalog.models["deepseek-v3"], catalog.hardware["b200-sxm"], weights="fp8", eff=eff)
    ep8 = decode_step(s, 8, 8, 1, 1, 64, 2048)
    etp = decode_step(s, 8, 1, 1, 1, 64, 2048)
    assert float(ep8.comm_s) == pytest.approx(float(etp.comm_s), rel=1e-12)
    # 61 layers x 2 all-reduces, each at least the collective latency
    assert float(ep8.comm_s) >= 61 * 2 * 20e-6
    # tp 1 x dp 8: no all-reduce left, only the dispatch and combine of the 58 MoE layers
    dep = decode_step(s, 1, 8, 1, 8, 64, 2048)
    assert float(dep.comm_s) >= 58 * 2 * 20e-6


def test_accepted_tokens_per_step():
    from planner.perf.roofline import accepted_tokens

    assert accepted_tokens(0, 0.7) == pytest.approx(1.0)
    assert accepted_tokens(3, 0.7) == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    assert accepted_tokens(3, 1.0) == pytest.approx(4.0)
    assert accepted_tokens(2, 0.0) == pytest.approx(1.0)


def test_speculative_step_verifies_k_plus_one_tokens(catalog):
    """Verifying ``k`` drafts is a step over ``B (k + 1)`` tokens that reads every sequence's KV once:
    its compute equals a plain step of ``B (k + 1)`` sequences, its KV traffic a plain step of ``B``,
    and the time per output token is (step + drafting) / accepted tokens."""
    from dataclasses import replace

    from planner.perf.roofline import accepted_tokens

    m, hw = catalog.models["llama-3.1-70b"], catalog.hardware["h100-sxm"]
    plain = Setup.make(m, hw, weights="fp8")
    spec = replace(plain, spec_tokens=3.0, spec_accept=0.8)
    s = decode_step(spec, 4, 1, 1, 1, 16, 2048)
    wide = decode_step(plain, 4, 1, 1, 1, 64, 2048)
    one = decode_step(plain, 4, 1, 1, 1, 16, 2048)
    assert float(s.compute_s) == pytest.approx(float(wide.compute_s) - float(wide.attn_compute_s) + 4 * float(one.attn_compute_s), rel=1e-9)
    assert float(s.kv_read_bytes) == pytest.approx(float(one.kv_read_bytes), rel=1e-12)
    assert float(s.weight_read_bytes) == pytest.approx(float(one.weight_read_bytes), rel=1e-12)  # dense: every weight, once
    n = accepted_tokens(3.0, 0.8)
    assert float(s.tokens_per_step) == pytest.approx(n)
    step = float(s.step_s) * n - float(s.draft_s)
    assert step == pytest.approx(float(one.step_s) + float(s.comm_s) - float(one.comm_s), rel=0.02)  # memory-bound: same weights
    # Memory-bound (batch 16; or a large batch at long context, where the KV read is shared by the
    # verified tokens): speculation pays. Compute-bound (large batch, short context): it does not.
    assert float(s.step_s) < 0.6 * float(one.step_s)
    assert float(decode_step(spec, 4, 1, 1, 1, 4096, 2048).step_s) < float(decode_step(plain, 4, 1, 1, 1, 4096, 2048).step_s)
    assert float(decode_step(spec, 4, 1, 1, 1, 8192, 128).step_s) > float(decode_step(plain, 4, 1, 1, 1, 8192, 128).step_s)


def test_speculative_draft_uses_the_mtp_layers(catalog):
    """Drafting runs the model's MTP layers (DeepSeek-V3: one) once per draft token: three drafts cost
    three times one."""
    from dataclasses import replace

    m, hw = catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"]
    assert m.architecture.mtp_layers == 1
    base = Setup.make(m, hw, weights="fp8", eff=hw.efficiency.for_engine("trtllm"))
    d1 = float(decode_step(replace(base, spec_tokens=1.0), 8, 8, 1, 1, 32, 2048).draft_s)
    d3 = float(decode_step(replace(base, spec_tokens=3.0), 8, 8, 1, 1, 32, 2048).draft_s)
    assert d1 > 0 and d3 == pytest.approx(3 * d1)
    plain = decode_step(base, 8, 8, 1, 1, 32, 2048)
    assert d1 < 0.1 * float(plain.step_s)  # one layer of 61 plus the LM head


def test_collectives_leaving_the_domain_pay_the_scale_out_latency(catalog):
    """A collective whose group spans more than one scale-up domain pays ``scale_out_latency_us`` on top
    of ``collective_latency_us``; inside the domain it does not."""
    from planner.catalog.schemas import EngineEfficiency
    from planner.perf.roofline import all_reduce_time, all_to_all_time

    hw = catalog.hardware["h100-sxm"]  # 8-GPU NVLink domain
    m = catalog.models["deepseek-v3"]
    a = Setup.make(m, hw, weights="fp8", eff=EngineEfficiency(collective_latency_us=10))
    b = Setup.make(m, hw, weights="fp8", eff=EngineEfficiency(collective_latency_us=10, scale_out_latency_us=40))
    for g in (8, 16, 64):
        extra = float(all_to_all_time(b, g, 1e6, 116, 10e-6) - all_to_all_time(a, g, 1e6, 116, 10e-6))
        assert extra == pytest.approx(116 * 40e-6 if g > 8 else 0.0, abs=1e-12)
        extra = float(all_reduce_time(b, g, 1e6, 3, 10e-6) - all_reduce_time(a, g, 1e6, 3, 10e-6))
        assert extra == pytest.approx(3 * 40e-6 if g > 8 else 0.0, abs=1e-12)
    # DEP16 over two HGX nodes: 2 exchanges per MoE layer leave the node.
    st_a = decode_step(a, 1, 16, 1, 16, 64, 2048)
    st_b = decode_step(b, 1, 16, 1, 16, 64, 2048)
    assert float(st_b.comm_s - st_a.comm_s) == pytest.approx(2 * 58 * 40e-6, rel=1e-9)


def test_prefill_collectives_run_at_the_fitted_share_of_the_link(catalog):
    """``prefill_comm_bandwidth`` scales the bandwidth term of a prefill pass's collectives (latencies
    stay) and leaves decode collectives alone."""
    from planner.catalog.schemas import EngineEfficiency
    from planner.perf.roofline import prefill_parts

    m, hw = catalog.models["llama-3.1-70b"], catalog.hardware["h100-sxm"]
    full = Setup.make(m, hw, weights="fp8", eff=EngineEfficiency(collective_latency_us=10))
    half = Setup.make(m, hw, weights="fp8", eff=EngineEfficiency(collective_latency_us=10, prefill_comm_bandwidth=0.5))
    lat = 2 * 80 * 10e-6  # two all-reduces per layer
    c_full = float(prefill_parts(full, 8, 1, 1, 1, 8192)[2])
    c_half = float(prefill_parts(half, 8, 1, 1, 1, 8192)[2])
    # worked number: 160 ring all-reduces of 8192 x 8192 x 2 B over 8 GPUs at 450 GB/s
    assert c_full - lat == pytest.approx(160 * 2 * 7 / 8 * 8192 * 8192 * 2 / 450e9, rel=1e-9)
    assert c_half - lat == pytest.approx(2 * (c_full - lat), rel=1e-9)
    assert float(decode_step(half, 8, 1, 1, 1, 64, 2048).comm_s) == float(decode_step(full, 8, 1, 1, 1, 64, 2048).comm_s)


def test_moe_layers_pay_their_own_overhead(catalog):
    """``moe_layer_overhead_us`` adds to every MoE layer of a step (58 of DeepSeek-V3's 61) and to nothing
    in a dense model, on the datasheet roofline (H200 with its kernel curves timing no term; the catalog's H200 times
    its fused MoE layers by its curve, which then pays their fixed latency instead: tests/test_kernels.py)."""
    from planner.catalog.schemas import EngineEfficiency

    hw0 = catalog.hardware["h200-sxm"]
    kf = hw0.efficiency.kernels.model_copy(update={"terms": []})
    hw = hw0.model_copy(update={"efficiency": hw0.efficiency.model_copy(update={"kernels": kf})})
    for mid, moe_layers in (("deepseek-v3", 58), ("llama-3.1-70b", 0)):
        m = catalog.models[mid]
        a = Setup.make(m, hw, weights="fp8", eff=EngineEfficiency(layer_overhead_us=20))
        b = Setup.make(m, hw, weights="fp8", eff=EngineEfficiency(layer_overhead_us=20, moe_layer_overhead_us=30))
        d = float(decode_step(b, 8, 8 if moe_layers else 1, 1, 1, 32, 2048).step_s - decode_step(a, 8, 8 if moe_layers else 1, 1, 1, 32, 2048).step_s)
        assert d == pytest.approx(moe_layers * 30e-6, abs=1e-12)


def test_interleaved_prompts_arrive_in_chunks_not_spread_over_steps(catalog):
    """An aggregated step carrying ``X`` prompt tokens per step on average is a mix: a share ``X / c`` of the
    steps carries a chunk of ``c = min(chunk size, prompt)`` tokens, the rest are plain decode steps. The mean
    step is exactly that mix (the identity), and for an MoE model at a small batch it streams far fewer expert
    bytes than spreading the same tokens evenly, which would touch most experts in every step."""
    from dataclasses import replace

    s = Setup.make(catalog.models["deepseek-v3"], catalog.hardware["b200-sxm"], weights="fp8", eff=IDEAL)
    B, I, O = 4.0, 8192.0, 1024.0
    X = B * I / O  # 32 prompt tokens per step on average
    mixed = decode_step(s, 8, 1, 1, 1, B, I + O / 2, prefill_tokens_per_step=X, prefill_context=I)
    plain = decode_step(s, 8, 1, 1, 1, B, I + O / 2)
    chunk = decode_step(s, 8, 1, 1, 1, B, I + O / 2, prefill_tokens_per_step=I, prefill_context=I)
    q = X / I
    for part in ("step_s", "compute_s", "memory_s", "weight_read_bytes"):
        expect = (1 - q) * float(getattr(plain, part)) + q * float(getattr(chunk, part))
        assert float(getattr(mixed, part)) == pytest.approx(expect, rel=1e-9), part
    # Spread evenly, 36 tokens x 8 of 256 experts touch ~68% of the experts every step; in chunks the mean
    # step streams the 4 decode tokens' ~12% and, one step in 256, all of them.
    spread = decode_step(s, 8, 1, 1, 1, B, I + O / 2, prefill_tokens_per_step=X, prefill_context=1.0)
    expert = s.wb.expert / 8
    assert float(spread.weight_read_bytes) - float(plain.weight_read_bytes) > 0.5 * expert
    assert float(mixed.weight_read_bytes) - float(plain.weight_read_bytes) < 0.01 * expert
    # A smaller chunk size splits a long prompt: more chunk steps, each with fewer tokens.
    small = decode_step(replace(s, prefill_chunk_tokens=2048.0), 8, 1, 1, 1, B, I + O / 2,
                        prefill_tokens_per_step=X, prefill_context=I)
    assert float(small.weight_read_bytes) > float(mixed.weight_read_bytes)
    # At or above the chunk size every step carries the prompt tokens: no mix, whatever the chunk size.
    big = 256 * I / O * 4
    full = decode_step(s, 8, 1, 1, 1, 256.0, I + O / 2, prefill_tokens_per_step=big, prefill_context=I)
    part = decode_step(replace(s, prefill_chunk_tokens=2048.0), 8, 1, 1, 1, 256.0, I + O / 2,
                       prefill_tokens_per_step=big, prefill_context=I)
    assert float(full.step_s) == pytest.approx(float(part.step_s), rel=1e-12)


def test_a_cached_prefix_shrinks_the_chunk_to_the_new_tokens(catalog):
    """Behind a cached prefix a prompt brings only its new tokens: the chunk a step carries is those, so the same
    prompt tokens per step need more chunk steps, each streaming the experts once (the identity with the chunk
    of new tokens, not of the whole prompt)."""
    from planner.perf.serving import agg_decode

    s = Setup.make(catalog.models["deepseek-v3"], catalog.hardware["b200-sxm"], weights="fp8", eff=IDEAL)
    B, I, O, N = 4.0, 8192.0, 1024.0, 1024.0
    cached = agg_decode(s, 8, 1, 1, 1, B, I, O, new_tokens=N)
    X = B * N / O
    plain = decode_step(s, 8, 1, 1, 1, B, I + O / 2)
    chunk = decode_step(s, 8, 1, 1, 1, B, I + O / 2, prefill_tokens_per_step=N, prefill_context=I,
                        prefill_prompt_tokens=N)
    q = X / N
    assert float(cached.weight_read_bytes) == pytest.approx(
        (1 - q) * float(plain.weight_read_bytes) + q * float(chunk.weight_read_bytes), rel=1e-9)
    whole = decode_step(s, 8, 1, 1, 1, B, I + O / 2, prefill_tokens_per_step=X, prefill_context=I)
    assert float(cached.weight_read_bytes) > float(whole.weight_read_bytes)
    # a share of the prompts (the others' in a closed loop) scales the prompt tokens, not the chunk
    half = agg_decode(s, 8, 1, 1, 1, B, I, O, prompt_share=0.5)
    full = agg_decode(s, 8, 1, 1, 1, B, I, O)
    extra = float(full.step_s) - float(plain.step_s)
    assert float(half.step_s) - float(plain.step_s) == pytest.approx(extra / 2, rel=1e-9)


def test_attention_dp_chunks_land_on_one_rank():
    """``_chunk_steps`` worked numbers: without attention DP it is the replica's own chunking; at DP8 a rank takes a
    chunk in ``p = X / (8 unit)`` of the steps and some rank does in ``1 - (1 - p)^8`` of them; balanced ranks take
    theirs together. In every case the prompt tokens are conserved: share x chunk = X."""
    from planner.perf.roofline import _chunk_steps

    c, r, sh = _chunk_steps(512.0, 1024.0, 1.0)
    assert (float(c), float(r), float(sh)) == pytest.approx((1024.0, 1024.0, 0.5))
    c, r, sh = _chunk_steps(2048.0, 1024.0, 1.0)
    assert (float(c), float(r), float(sh)) == pytest.approx((2048.0, 2048.0, 1.0))
    c, r, sh = _chunk_steps(512.0, 1024.0, 8.0)
    p = 512.0 / 8 / 1024.0
    assert float(sh) == pytest.approx(1.0 - (1.0 - p) ** 8) and float(r) == 1024.0
    assert float(c) == pytest.approx(8 * p * 1024.0 / (1.0 - (1.0 - p) ** 8))
    c, r, sh = _chunk_steps(512.0, 1024.0, 8.0, balanced=True)
    assert (float(c), float(r), float(sh)) == pytest.approx((8192.0, 1024.0, p))
    import numpy as np

    X = np.array([1.0, 64.0, 512.0, 4096.0, 20000.0])
    for dp in (1.0, 4.0, 8.0, 48.0):
        for bal in (False, True):
            c, r, sh = _chunk_steps(X, 1024.0, dp, bal)
            assert np.allclose(c * sh, X), (dp, bal)
            assert np.all(r <= c + 1e-9) and np.all(r >= np.minimum(X, 1024.0) - 1e-9)


def test_an_attention_dp_step_waits_for_the_rank_with_the_prompt(catalog):
    """DeepSeek at attention-DP8 EP8, 64 sequences a rank and 512 prompt tokens a step: the rank that takes a 1,024-token
    chunk runs its attention and dense GEMMs over 1,088 tokens while the others wait at the next expert exchange, so
    the mean step is slower than with the chunks spread (balanced ranks) and slower than one replica's chunking
    spread over the ranks; without attention DP the setting changes nothing."""
    from dataclasses import replace

    s = Setup.make(catalog.models["deepseek-v3"], catalog.hardware["h200-sxm"], weights="fp8",
                   eff=catalog.hardware["h200-sxm"].efficiency.for_engine("trtllm"))
    kw = dict(prefill_tokens_per_step=512.0, prefill_context=1024.0)
    plain = decode_step(s, 1, 8, 1, 8, 512.0, 2048.0)
    one = decode_step(s, 1, 8, 1, 8, 512.0, 2048.0, **kw)
    bal = decode_step(replace(s, adp_prefill_balance=True), 1, 8, 1, 8, 512.0, 2048.0, **kw)
    assert float(plain.step_s) < float(bal.step_s) < float(one.step_s)
    # the busiest rank's chunk: its non-expert compute is that of 64 + 1,024 tokens, not 64 + 1,024 / 8
    from planner.perf.roofline import _stage_time

    on_one = _stage_time(s, 1.0, 8.0, 1.0, 8.0, 512.0, 2048.0, 1024.0, 1024.0, xr=1024.0)[0]
    spread = _stage_time(s, 1.0, 8.0, 1.0, 8.0, 512.0, 2048.0, 1024.0, 1024.0)[0]
    assert float(on_one.gemm_c) - float(plain.gemm_compute_s) > 4 * (float(spread.gemm_c) - float(plain.gemm_compute_s))
    tp8 = decode_step(s, 8, 8, 1, 1, 512.0, 2048.0, **kw)
    tp8b = decode_step(replace(s, adp_prefill_balance=True), 8, 8, 1, 1, 512.0, 2048.0, **kw)
    assert float(tp8.step_s) == pytest.approx(float(tp8b.step_s), rel=1e-12)


def test_context_share_is_the_steps_elasticity_to_context(catalog):
    """``StepTimes.context_share`` (the attention's share of the binding resource, what the TPOT spread from the
    batch's contexts scales with) matches the step's numerical elasticity to its context for a memory-bound dense
    decode (Llama 70B, ideal H100, batch 32), and grows from short to long context."""
    s = ideal(catalog, "llama-3.1-70b", "h100-sxm")
    shares = []
    for ctx in (1000.0, 32_000.0):
        st = decode_step(s, 8, 1, 1, 1, 32, ctx)
        up, dn = (float(decode_step(s, 8, 1, 1, 1, 32, ctx * f).step_s) for f in (1.01, 1 / 1.01))
        elasticity = math.log(up / dn) / (2 * math.log(1.01))
        assert float(st.context_share) == pytest.approx(elasticity, abs=0.03)
        shares.append(float(st.context_share))
    assert 0.0 < shares[0] < shares[1] < 1.0
