"""Kernel curves: the time of each kernel a serving step is made of, as a physical function of its shape.

Each curve takes the shape of one kernel call (NumPy arrays broadcast, so a candidate table is evaluated in
one call), the hardware's datasheet peaks (FLOP/s of the maths format, HBM and scale-up bandwidth, in SI)
and a handful of fitted parameters (``planner calibrate kernels``, from measured kernel latencies; see
``planner/calib/kernels.py``), and returns seconds. The parameters are fractions of the datasheet and
fixed latencies, never tables of measured rows, so a curve extends to shapes, models and hardware without
a row: a GPU without kernel measurements uses the same curves with :data:`PRIOR` parameters.

Every curve is a roofline: the larger of compute and memory time, smooth for GEMMs and fused MoE
(``(t_c^p + t_m^p)^(1/p)``; ``p`` large: the plain maximum; small ``p``: a kernel that overlaps the two only partly),
plain for decode attention, plus a fixed latency ``t0`` that no shape avoids (launch, prologue and epilogue of one
kernel) and the per-family terms below.

Families and their parameters (times in microseconds, efficiencies as fractions of the datasheet):

``gemm``
    ``[m x k] @ [k x n]``: padded to tiles of :data:`TILE_M` x :data:`TILE_N` (tensor-core instruction
    shapes; a GEMM of 8 tokens pays for 64 rows), a machine that fills as tiles grow
    (``tiles / (tiles + tile_half)``: too few tiles leave SMs idle), weights streamed once, activations
    read at ``act_bytes`` per element (quantising activations to FP8/FP4 reads and writes them again,
    which the fit sees), output written in bf16. Parameters: ``t0_us, compute, tile_half, memory, sharpness,
    act_bytes``.
``moe``
    One fused MoE layer on one GPU (route, grouped GEMMs of its local experts, combine): the routed tokens
    as a grouped GEMM over the experts they touch, each expert's rows padded to :data:`TILE_M`, at the fitted
    share of the tensor peak plus a cost per output tile (``tile_ns``: a tile's prologue and epilogue, amortised
    over the SMs; an expert of few columns, as tensor or expert parallelism leaves it, is many tiles of short
    reductions and runs far below the peak its FLOPs alone would take, while the same layer with wide experts
    gets close to it); the weights of touched local experts streamed once, each routed copy's activations read
    and written in bf16 (permute in, intermediate, out); plus the activation buffers of *every* routed copy of
    the tokens entering the layer, local or not: the engines size their per-copy buffers by all ``tokens x
    top_k`` copies, write the gate/up output (``2 inter``, gated) and read it back for the activation, write the
    activated half (``inter``), write each copy's down-projection output (``hidden``, zeros where the expert
    sits elsewhere) and read it to sum a token's ``top_k`` copies: ``2 hidden + 5 inter`` elements a copy
    (``2 hidden + 3 inter`` ungated) at ``copy_bytes`` bytes per element over the HBM bandwidth (bf16 at the
    full bandwidth is 2; the top-k, sort and align over all tokens ride on it). This is what makes a wide-EP
    layer cost more than its local FLOPs, in proportion to the layer's width: on B200 (SGLang, FP8 blocks) a
    Qwen3-235B-sized layer (hidden 4,096, 128 experts, top-8) over 128 GPUs, one local expert each, still takes
    775 us for 16,384 tokens, 5.9 ns a routed copy. One curve per kernel an engine runs for a format (its
    main one under the engine's name, others as ``engine-triton`` and the like). Parameters: ``t0_us,
    compute, tile_ns, memory, sharpness, copy_bytes``.
``attn_decode`` / ``mla_decode``
    One decode step of attention for a batch: the KV cache read once (GQA: ``2 kv_heads head_dim``
    elements per token; MLA: one latent of ``kv_lora + rope`` per token, shared by all heads), query
    maths ``4 heads head_dim`` FLOPs per token (MLA absorbed: ``2 heads (2 kv_lora + rope)``), the larger of
    the two as the kernel's busy time; plus a cost per work unit (``unit_us``: one (sequence, KV head) pair of
    GQA, one sequence of MLA; its query load, softmax and output, paid even at no context). The units spread
    over the SMs; few of them run at ``units / (units + fill_half)`` of the rate, unless the kernel splits
    each sequence's context over several blocks (split-KV, TensorRT-LLM's multi-block mode, FlashInfer's
    and FlashMLA's partitions), which runs at the full rate but pays a second, reduction phase (``red_us``).
    The kernels pick the faster of the two, so the step takes the smaller. Parameters: ``t0_us, unit_us,
    compute, memory, red_us, fill_half``.
``attn_context`` / ``mla_context``
    One prefill pass of causal attention over a batch of prompts (FlashAttention-style: each (sequence, query head,
    tile of :data:`TILE_Q` query rows) is a work unit that walks the keys up to its diagonal). Busy time: the FLOPs
    (GQA ``4 head_dim`` per query-key pair and head, MLA decompressed ``2 (qk_dim + v_dim)``) at ``compute`` of the
    peak, but never less than the longest unit (the last query tile, over the whole context or window) times ``sms``
    units running side by side: a short prompt or a few heads leave most SMs idle while that tile finishes; queries,
    keys, values and output moved once at ``memory`` of HBM, smoothly combined with the compute (``sharpness``);
    plus a cost per work unit (``unit_us``: loading its query tile, the softmax's final rescale and the output
    write, paid however short its key walk) and a fixed latency. This is what makes the measured rate climb with the
    prompt: DeepSeek's context MLA reaches 0.17-0.24 of the BF16 peak at 1K tokens and 0.57-0.77 at 8K on Blackwell
    (``python bench/context_attention_rate.py``). Parameters: ``t0_us, unit_us, compute, memory, sms, sharpness``.
``collective``
    One collective of ``bytes`` over ``g`` GPUs of one scale-up domain: ``alpha + alpha_gpu (g - 2)`` plus the
    bus bytes (ring all-reduce ``2 (g-1)/g``, all-gather, reduce-scatter and all-to-all ``(g-1)/g`` of the
    message) over ``bus_eff`` of the scale-up bandwidth, plus the first ``switch_kb`` of them again over
    ``slow_eff`` of it: below a switch size the libraries run their low-latency protocols (NCCL's LL and LL128,
    whose flags halve or trim the payload of each line; the engines' one-shot all-reduce, where every GPU reads
    every peer's whole buffer), which pay little latency but move bytes slowly, and a large message pays that
    ramp once before the bandwidth protocol takes over. Parameters: ``alpha_us, alpha_gpu_us, bus_eff,
    switch_kb, slow_eff``.
``deepep``
    DeepEP low-latency dispatch plus combine of one MoE layer inside one node: each token's ``top_k``
    copies leave for their experts' GPUs (dispatch in FP8 with scales, combine in bf16) at ``bus_eff`` of
    the scale-up bandwidth, plus a fixed latency per call, a cost per token copy (the kernels' packing) and
    one per local expert slot (``slot_ns``: each slot's receive buffer is polled and its count exchanged).
    The kernels give each expert slot its own warp groups, so an expert's copies also move at no more
    than ``expert_gbps`` (GB/s): with few experts (Mixtral's 8 over 4 GPUs) the busiest expert's traffic,
    not the link, sets the time. Parameters: ``t0_us, copy_ns, bus_eff, slot_ns, expert_gbps``.
``alltoall``
    One call of TensorRT-LLM's NVLink MoE all-to-all (dispatch or combine of one MoE layer; its ``prepare`` counted
    with the dispatch) over ``g`` ranks of a multi-node NVLink domain. The kernel gives each token one warp, which
    loads the token once and stores it to every distinct rank among its ``top_k`` experts (a token is sent once per
    rank, not once per expert): a fixed latency per call and per peer rank (the counters and completion flags every
    rank exchanges), a cost per token, and the token's bytes to other ranks at a per-GPU rate that depends on whether
    every peer sits in the GPU's own node (``near_gbps``) or the group spans nodes (``far_gbps``; a GB200 tray holds
    4 GPUs). The rates are those of warp-issued stores, far below the link: a token's second and later destinations
    ride the same load and cost ``fan_share`` of its first each. The measured rows route every token to consecutive
    experts (one rank per token up to 32 ranks, two at 64); real routing reaches ``g (1 - C(E - E/g, k) / C(E, k))``
    ranks (:func:`rank_fanout`). Parameters: ``t0_us, peer_ns, tok_ns, near_gbps, far_gbps, fan_share``.
"""

from __future__ import annotations

import numpy as np

from planner.catalog.schemas import KERNEL_BOUNDS as BOUNDS  # noqa: F401 - the families' ranges, re-exported
from planner.catalog.schemas import KERNEL_PARAMS as PARAMS  # noqa: F401 - the families' parameters, re-exported

US = 1e-6

TILE_M = 64.0
"""Rows of one tensor-core tile (Hopper's ``wgmma`` and Blackwell's ``tcgen05`` issue 64- or 128-row tiles;
a decode GEMM of a few tokens still pays for a whole tile of rows)."""
TILE_N = 128.0

PRIOR: dict[str, dict[str, float]] = {
    "gemm": {"t0_us": 4.0, "compute": 0.7, "tile_half": 60.0, "memory": 0.8, "sharpness": 2.5, "act_bytes": 3.0},
    "moe": {"t0_us": 30.0, "compute": 0.5, "tile_ns": 10.0, "memory": 0.8, "sharpness": 2.5, "copy_bytes": 2.5},
    "attn_decode": {"t0_us": 8.0, "unit_us": 0.01, "compute": 0.3, "memory": 0.8, "red_us": 3.0, "fill_half": 8.0},
    "mla_decode": {"t0_us": 12.0, "unit_us": 0.1, "compute": 0.4, "memory": 0.8, "red_us": 3.0, "fill_half": 8.0},
    "attn_context": {"t0_us": 10.0, "unit_us": 0.02, "compute": 0.5, "memory": 0.5, "sms": 100.0, "sharpness": 3.0},
    "mla_context": {"t0_us": 10.0, "unit_us": 0.02, "compute": 0.5, "memory": 0.5, "sms": 100.0, "sharpness": 3.0},
    "collective": {"alpha_us": 10.0, "alpha_gpu_us": 1.0, "bus_eff": 0.75, "switch_kb": 1000.0, "slow_eff": 0.5},
    "deepep": {"t0_us": 40.0, "copy_ns": 5.0, "bus_eff": 0.3, "slot_ns": 100.0, "expert_gbps": 30.0},
    "alltoall": {"t0_us": 10.0, "peer_ns": 50.0, "tok_ns": 5.0, "near_gbps": 200.0, "far_gbps": 100.0, "fan_share": 0.3},
}
"""Parameters of hardware without kernel rows (and the fit's start): vendor-library expectations (large GEMMs
at ~70% of tensor peak, HBM streamed at ~80%, NCCL at ~75% of the link's bus bandwidth), refined by the fit on
every system that has rows (``planner calibrate kernels`` prints the fitted values beside them)."""

ACT_DTYPE_BYTES = 2.0
"""Output and activation bytes per element written by a kernel (bf16)."""


_SMAX_GRID = np.linspace(0.0, 1.0, 4097)
_SMAX_TABLES: dict[float, np.ndarray] = {}
_SMAX_EXACT_BELOW = 4096
"""Arrays smaller than this are evaluated exactly; larger ones through a 4,097-point table of the same function
(its error below 1e-6 relative: the curve is smooth in the ratio), which a candidate table's millions of rows
need for speed."""


def _smax(a, b, p):
    """Smooth maximum ``(a^p + b^p)^(1/p) = hi (1 + (lo/hi)^p)^(1/p)`` (the roofline's max as ``p`` grows; a kernel
    that overlaps its maths and its memory traffic only partly at small ``p``)."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    hi = np.maximum(np.maximum(a, b), 1e-30)
    r = np.minimum(a, b) / hi
    if r.size < _SMAX_EXACT_BELOW:
        return hi * np.power(1.0 + np.power(r, p), 1.0 / p)
    tab = _SMAX_TABLES.get(p)
    if tab is None:
        tab = _SMAX_TABLES[p] = np.power(1.0 + np.power(_SMAX_GRID, p), 1.0 / p)
    return hi * np.interp(r, _SMAX_GRID, tab)


def gemm_time(p: dict, m, n, k, flops_peak, hbm_bw, weight_bytes, fixed=1.0):
    """Seconds of one ``[m x k] @ [k x n]`` GEMM with weights of ``weight_bytes`` per element (see module
    docstring; ``flops_peak`` is the datasheet FLOP/s of the maths format; ``fixed``: the share of the fixed
    latency paid, 1 for a kernel timed alone)."""
    m = np.maximum(np.asarray(m, dtype=float), 1.0)
    n = np.asarray(n, dtype=float)
    k = np.asarray(k, dtype=float)
    mt = np.ceil(m / TILE_M)
    nt = np.ceil(n / TILE_N)
    tiles = mt * nt
    fill = tiles / (tiles + p["tile_half"])
    t_c = 2.0 * mt * TILE_M * nt * TILE_N * k / (flops_peak * p["compute"] * fill)
    t_m = (weight_bytes * n * k + p["act_bytes"] * m * k + ACT_DTYPE_BYTES * m * n) / (hbm_bw * p["memory"])
    return fixed * p["t0_us"] * US + _smax(t_c, t_m, p["sharpness"])


def expected_touched(experts, top_k, tokens):
    """Expected distinct experts that ``tokens`` tokens, each choosing ``top_k`` of ``experts`` uniformly, touch."""
    e = np.asarray(experts, dtype=float)
    t = np.maximum(np.asarray(tokens, dtype=float), 0.0)
    return e * (1.0 - np.power(np.clip(1.0 - np.asarray(top_k, dtype=float) / e, 0.0, 1.0), t))


def uniform_moe_load(tokens, top_k, experts, local_experts, imbalance=1.0):
    """(copies, touched experts, tile-padded rows) on one GPU holding ``local_experts`` of ``experts`` when
    ``tokens`` tokens pick ``top_k`` experts uniformly; ``imbalance`` multiplies the busiest GPU's share."""
    t = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    e = np.asarray(experts, dtype=float)
    el = np.minimum(np.asarray(local_experts, dtype=float), e)
    imb = np.asarray(imbalance, dtype=float)
    copies = t * top_k * el / e * imb
    touched = np.maximum(np.minimum(expected_touched(e, top_k, t) * el / e * imb, el), 1.0)
    rows = touched * np.ceil(copies / touched / TILE_M) * TILE_M
    return copies, touched, rows


def moe_time(p: dict, tokens, hidden, inter, top_k, experts, local_experts, flops_peak, hbm_bw, weight_bytes,
             gated=True, imbalance=1.0, fixed=1.0, routed_tokens=None, load=None):
    """Seconds of one fused MoE layer on one GPU holding ``local_experts`` experts of ``inter`` columns each
    (already divided by expert tensor parallelism), for ``tokens`` tokens routed over ``experts`` experts
    (``top_k`` each, uniformly; ``imbalance`` multiplies the busiest GPU's share). ``gated``: three matrices
    per expert (SwiGLU), else two. ``routed_tokens``: the tokens whose routed copies this GPU buffers (top-k,
    sort, align, the per-copy activation buffers; default ``tokens``, as in the kernel data, where every rank
    routes every token): with attention data parallelism and a dispatch kernel, a GPU routes only its own rank's
    tokens. ``load``: (copies, touched experts, padded rows)
    on this GPU where routing is not uniform (``routing.power_law_loads``); default :func:`uniform_moe_load`."""
    t = np.maximum(np.asarray(tokens, dtype=float), 1.0)
    h = np.asarray(hidden, dtype=float)
    inter = np.asarray(inter, dtype=float)
    mats = 3.0 if gated else 2.0
    # Copies that land on this GPU, the local experts they touch and their rows padded to tiles.
    copies, touched, rows = load if load is not None else uniform_moe_load(t, top_k, experts, local_experts, imbalance)
    # Gate/up (``mats - 1`` matrices of inter x hidden) and down (hidden x inter) over the padded rows.
    tiles = rows / TILE_M * (np.ceil((mats - 1.0) * inter / TILE_N) + np.ceil(h / TILE_N))
    t_c = 2.0 * rows * mats * h * inter / (flops_peak * p["compute"]) + tiles * p["tile_ns"] * 1e-9
    w = touched * mats * h * inter * weight_bytes
    act = copies * ACT_DTYPE_BYTES * (2.0 * h + 2.0 * inter)
    t_m = (w + act) / (hbm_bw * p["memory"])
    rt = t if routed_tokens is None else np.asarray(routed_tokens, dtype=float)
    # Every routed copy's buffers: gate/up out written and read, activation out written, down out written and summed.
    routing = rt * top_k * (2.0 * h + (2.0 * mats - 1.0) * inter) * p["copy_bytes"] / hbm_bw
    return fixed * p["t0_us"] * US + routing + _smax(t_c, t_m, p["sharpness"])


def attn_decode_time(p: dict, batch, kv_bytes, flops, flops_peak, hbm_bw, units=None, fixed=1.0):
    """Seconds of one decode step of attention for ``batch`` sequences reading ``kv_bytes`` of cache and doing
    ``flops`` FLOPs in all (the caller counts both: GQA or MLA, context or window). ``units``: the independent
    work units the kernel spreads over the SMs, (sequence, KV head) pairs of GQA (default ``batch``, as MLA).
    Busy time ``max(t_c, t_m)``; with one block a unit it runs at ``units / (units + fill_half)`` of the rate,
    split over blocks at the full rate plus a reduction phase of ``red_us``, whichever is faster."""
    b = np.asarray(batch, dtype=float)
    u = b if units is None else np.asarray(units, dtype=float)
    fill = u / (u + p["fill_half"])
    busy = np.maximum(np.asarray(flops, dtype=float) / (flops_peak * p["compute"]),
                      np.asarray(kv_bytes, dtype=float) / (hbm_bw * p["memory"]))
    one_block, split = busy / np.maximum(fill, 1e-12), busy + fixed * p["red_us"] * US
    return fixed * p["t0_us"] * US + p["unit_us"] * US * u + np.minimum(one_block, split)


TILE_Q = 128.0
"""Query rows of one work unit of a prefill attention kernel (FlashAttention 2/3 and the engines' context FMHA tile
128 queries on Hopper and Blackwell)."""


def attn_context_time(p: dict, flops, moved_bytes, longest_flops, units, flops_peak, hbm_bw, fixed=1.0):
    """Seconds of one prefill pass of attention (one layer): ``flops`` in all, ``moved_bytes`` of queries, keys,
    values and output, ``longest_flops`` of the longest work unit (the last query tile of one head over its whole
    context or window) and ``units`` work units (sequences x query heads x query tiles); see the module docstring."""
    f = np.asarray(flops, dtype=float)
    rate = flops_peak * p["compute"]
    t_c = np.maximum(f / rate, np.asarray(longest_flops, dtype=float) * p["sms"] / rate)
    t_m = np.asarray(moved_bytes, dtype=float) / (hbm_bw * p["memory"])
    return fixed * p["t0_us"] * US + p["unit_us"] * US * np.asarray(units, dtype=float) + _smax(t_c, t_m, p["sharpness"])


def context_attention_shape(batch, new_tokens, prefix, heads, kv_heads, qk_dim, v_dim, window=0.0, mla=False):
    """(flops, moved bytes, longest unit's flops, units) of one layer's prefill attention for ``batch`` prompts of
    ``new_tokens`` each after ``prefix`` cached tokens, on a GPU holding ``heads`` query heads (``kv_heads`` KV
    heads; MLA: decompressed, one KV head per query head), ``2 (qk_dim + v_dim)`` FLOPs per query-key pair and head;
    ``window``: a sliding window (0: full). Activations in bf16; the cached prefix's keys and values read once."""
    b = np.asarray(batch, dtype=float)
    n = np.maximum(np.asarray(new_tokens, dtype=float), 1.0)
    pre = np.asarray(prefix, dtype=float)
    w = np.asarray(window, dtype=float)
    pairs = n * pre + n * (n + 1.0) / 2.0
    ctx = pre + n
    if np.any(w > 0):
        pairs = np.where(w > 0, np.minimum(pairs, n * w), pairs)
        ctx = np.where(w > 0, np.minimum(ctx, w), ctx)
    per_pair = 2.0 * (qk_dim + v_dim)
    hk = heads if mla else kv_heads
    flops = b * heads * per_pair * pairs
    moved = ACT_DTYPE_BYTES * b * (n * (heads * (qk_dim + v_dim) + hk * (qk_dim + v_dim)) + pre * hk * (qk_dim + v_dim))
    longest = TILE_Q * per_pair * ctx
    units = b * heads * np.ceil(n / TILE_Q)
    return flops, moved, longest, units


XQA_GROUPS = (2, 32)
"""Query heads per KV head that TensorRT-LLM's XQA decode kernel serves (measured on all six systems: groups 2-32
read each KV head once per sequence; a group of 1 (multi-head attention) or above 32 runs the generic masked
multi-head attention kernel, whose CUDA-core maths makes a group of 64-128 4-5x slower)."""


def head_dim_format(fmt: str, head_dim: int) -> str:
    """The format key of a GQA decode-attention curve for one head dimension (``bf16-hd128``). The kernels are
    templates compiled per head dimension, each with its own tiles and code path: on H100 SGLang's runs a
    128-wide head at 12.5 us and a 192-wide one at 21 us with no context at all, and a 512-wide one streams its
    cache 30x slower than HBM allows (``docs/validation.md``), so one curve over every head dimension describes none."""
    return f"{fmt}-hd{int(head_dim)}"


def head_dim_formats(available, fmts: tuple[str, ...], head_dim: int) -> tuple[str, ...]:
    """Format keys to try, best first, for a model of ``head_dim`` among ``available`` keys: per format of ``fmts``
    its curve at that head dimension, else at the nearest measured one above (the kernel pads the head to it), else
    below, else the format's curve over all head dimensions (a catalog fitted before the split)."""
    out: list[str] = []
    for f in fmts:
        dims = sorted({int(k.rsplit("-hd", 1)[1]) for k in available
                       if k.startswith(f + "-hd") and k.rsplit("-hd", 1)[1].isdigit()})
        above = [d for d in dims if d >= head_dim]
        below = sorted((d for d in dims if d < head_dim), reverse=True)
        out += [head_dim_format(f, d) for d in above + below] + [f]
    return tuple(dict.fromkeys(out))


def decode_attention_kernel(engine: str | None, group) -> np.ndarray:
    """Per element of ``group`` (query heads per KV head on one GPU), the kernel-path suffix of ``engine``'s
    decode attention curve: ``"-mmha"`` where TensorRT-LLM leaves XQA for its generic kernel, else ``""``."""
    g = np.asarray(group, dtype=float)
    if engine != "trtllm":
        return np.full(g.shape, "", dtype=object)
    return np.where((g < XQA_GROUPS[0]) | (g > XQA_GROUPS[1]), "-mmha", "").astype(object)


BUS_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "alltoall": 1.0}
"""Bus bytes per message byte of each collective, times ``(g - 1) / g`` (NCCL's bus-bandwidth convention)."""


def collective_time(p: dict, op: str, gpus, msg_bytes, link_bw, fixed=1.0):
    """Seconds of one collective ``op`` of ``msg_bytes`` (the whole buffer) over ``gpus`` GPUs of one scale-up
    domain with ``link_bw`` bytes/s per GPU and direction; 0 for one GPU."""
    g = np.asarray(gpus, dtype=float)
    gs = np.maximum(g, 2.0)
    traffic = BUS_FACTOR[op] * (gs - 1.0) / gs * np.asarray(msg_bytes, dtype=float)
    bus = traffic / (link_bw * p["bus_eff"]) + np.minimum(traffic, p["switch_kb"] * 1e3) / (link_bw * p["slow_eff"])
    alpha = fixed * (p["alpha_us"] + p["alpha_gpu_us"] * (gs - 2.0)) * US
    return np.where(g > 1, alpha + bus, 0.0)


def rank_fanout(experts, top_k, gpus):
    """Expected distinct ranks among a token's ``top_k`` experts drawn uniformly from ``experts`` split contiguously
    over ``gpus`` ranks: ``g (1 - C(E - E/g, k) / C(E, k))``."""
    e = np.maximum(np.asarray(experts, dtype=float), 1.0)
    g = np.maximum(np.asarray(gpus, dtype=float), 1.0)
    miss = np.ones(np.broadcast(e, g).shape)
    for j in range(int(top_k)):
        miss = miss * np.clip((e - e / g - j) / (e - j), 0.0, 1.0)
    return g * (1.0 - miss)


def alltoall_time(p: dict, tokens_per_rank, payload_bytes, fanout, gpus, node_gpus, fixed=1.0):
    """Seconds of one TensorRT-LLM NVLink all-to-all call (dispatch or combine, see module docstring): ``tokens_per_rank``
    tokens of ``payload_bytes`` each, every token sent to ``fanout`` distinct ranks (its own among them with
    probability ``1 / gpus``) of ``gpus``; ``node_gpus`` GPUs a node; 0 for one rank."""
    g = np.maximum(np.asarray(gpus, dtype=float), 1.0)
    n = np.asarray(tokens_per_rank, dtype=float)
    d = np.maximum(np.asarray(fanout, dtype=float), 1.0)
    rate = np.where(g <= node_gpus, p["near_gbps"], p["far_gbps"]) * 1e9
    sent = n * np.asarray(payload_bytes, dtype=float) * (1.0 + p["fan_share"] * (d - 1.0)) * (g - 1.0) / g
    t = fixed * (p["t0_us"] * US + p["peer_ns"] * 1e-9 * g) + n * p["tok_ns"] * 1e-9 + sent / rate
    return np.where(g > 1, t, 0.0)


def deepep_time(p: dict, tokens_per_rank, hidden, top_k, gpus, link_bw, dispatch_bytes=1.0, fixed=1.0, *,
                experts):
    """Seconds of one DeepEP low-latency dispatch plus combine inside one scale-up domain of ``gpus`` GPUs:
    ``tokens_per_rank`` tokens per GPU, each sent to ``top_k`` of ``experts`` expert slots (dispatch at
    ``dispatch_bytes`` per element plus one scale per 128, combine in bf16), the copies to other GPUs over the
    link, each slot's copies at most ``expert_gbps`` (see module docstring)."""
    g = np.maximum(np.asarray(gpus, dtype=float), 1.0)
    e = np.maximum(np.asarray(experts, dtype=float), 1.0)
    copies = np.asarray(tokens_per_rank, dtype=float) * top_k
    per_copy = np.asarray(hidden, dtype=float) * (dispatch_bytes * (1.0 + 4.0 / 128.0) + ACT_DTYPE_BYTES)
    remote = (g - 1.0) / g
    link = copies * remote * per_copy / (link_bw * p["bus_eff"])
    slot = copies * g / e * per_copy / (p["expert_gbps"] * 1e9)
    fixed_t = 2.0 * fixed * p["t0_us"] * US + e / g * p["slot_ns"] * 1e-9
    t = fixed_t + copies * p["copy_ns"] * 1e-9 + np.maximum(link, slot)
    return np.where(g > 1, t, 0.0)
