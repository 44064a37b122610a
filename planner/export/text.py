"""Human-readable text for the CLI."""

from __future__ import annotations

from planner.perf.report import RooflineResult


def _b(x: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:.0f} B"


def _t(x: float) -> str:
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.3f} ms"
    return f"{x * 1e6:.1f} us"


def _balance(b: float | None) -> str:
    return f"{b:,.0f} sequences" if b else "none"


def roofline_text(r: RooflineResult) -> str:
    eng = f", engine {r.engine}" if r.engine else ""
    tbo = ", two micro-batch overlap" if r.tbo else ""
    lines = [
        f"{r.model} on {r.hardware}: {r.layout} = {r.chips} chips{tbo}, "
        f"batch {r.batch:g} at context {r.context:g} ({r.mode}{eng})",
        f"  weights {r.weights_dtype} (experts {r.expert_weights_dtype}), KV {r.kv_dtype}",
        "",
        f"  step time (TPOT)   {_t(r.step_time_s):>12}   bound: {r.bound}",
        f"    compute          {_t(r.compute_time_s):>12}",
        f"    memory           {_t(r.memory_time_s):>12}   (weights {_b(r.weight_read_bytes_per_chip)}, "
        f"KV {_b(r.kv_read_bytes_per_chip)} read per chip)",
        f"    communication    {_t(r.comm_time_s):>12}",
        f"    fixed overheads  {_t(r.overhead_time_s):>12}",
    ]
    if r.spec_tokens:
        lines += [
            f"    drafting         {_t(r.draft_time_s):>12}   ({r.spec_tokens:g} draft tokens, accept {r.spec_accept:g}: "
            f"{r.tokens_per_step:.2f} tokens per step; the parts above are per step)",
        ]
    lines += [
        f"  latency floor      {_t(r.latency_floor_s):>12}   (resident weights / HBM bandwidth, per step)",
        f"  balance batch      {_balance(r.balance_batch):>12}   "
        + ("(sequences in flight per replica where compute time equals memory time at this context)"
           if r.balance_batch else "(memory-bound at any batch at this context)"),
        "",
        f"  tokens/s (replica) {r.tokens_per_s:12.1f}   per user {r.tokens_per_s_per_user:.1f}",
    ]
    if not r.fits:
        lines.append("  cost               none: the layout does not fit (a layout that cannot run has no price)")
    elif r.usd_per_hour is not None:
        lines.append(f"  cost               {r.usd_per_hour:12.2f} $/h   {r.usd_per_mtok:.4f} $/M output tokens")
    else:
        lines.append("  cost               n/a (no price in the catalog)")
    free = r.hbm_bytes_per_chip - r.weight_bytes_per_chip - r.kv_bytes_per_chip - r.other_bytes_per_chip
    lines += [
        "",
        f"  memory per chip    weights {_b(r.weight_bytes_per_chip)}, KV {_b(r.kv_bytes_per_chip)}, "
        f"runtime {_b(r.other_bytes_per_chip)} of {_b(r.hbm_bytes_per_chip)}: "
        + ("fits" if r.fits else f"DOES NOT FIT (short by {_b(-free)})"),
    ]
    return "\n".join(lines)


def prefill_text(r) -> str:
    eng = f", engine {r.engine}" if r.engine else ""
    pre = f" after {r.prefix_tokens:g} cached" if r.prefix_tokens else ""
    lines = [
        f"{r.model} on {r.hardware}: {r.layout} = {r.chips} chips, prefill of {r.prompts:g} prompt"
        f"{'s' if r.prompts != 1 else ''} of {r.prompt_tokens:g} tokens{pre} ({r.mode}{eng})",
        f"  weights {r.weights_dtype} (experts {r.expert_weights_dtype}), KV {r.kv_dtype}",
        "",
        f"  pass time          {_t(r.pass_time_s):>12}   bound: {r.bound}",
        f"    compute          {_t(r.compute_time_s):>12}   (model FLOPs utilisation {r.model_flops_utilisation:.1%})",
        f"    memory           {_t(r.memory_time_s):>12}",
        f"    communication    {_t(r.comm_time_s):>12}",
        f"    fixed overheads  {_t(r.overhead_time_s):>12}",
        "",
        f"  prompt tokens/s    {r.tokens_per_s:12.0f}   per GPU {r.tokens_per_s_per_gpu:.0f}",
    ]
    if not r.fits:
        lines.append("  cost               none: the layout does not fit (a layout that cannot run has no price)")
    elif r.usd_per_hour is not None:
        lines.append(f"  cost               {r.usd_per_hour:12.2f} $/h   {r.usd_per_mtok_input:.4f} $/M input tokens")
    else:
        lines.append("  cost               n/a (no price in the catalog)")
    lines += [
        "",
        f"  memory per chip    weights {_b(r.weight_bytes_per_chip)}, KV written {_b(r.kv_bytes_written_per_chip)}: "
        + ("fits" if r.fits else "DOES NOT FIT"),
    ]
    return "\n".join(lines)


def catalog_text(data: dict) -> str:
    lines = ["Models", f"  {'id':22} {'total':>9} {'active':>8} {'KV/token bf16':>14}  attention  hf ids"]
    for m in data["models"]:
        lines.append(
            f"  {m['id']:22} {m['total_params'] / 1e9:8.1f}B {m['active_params'] / 1e9:7.1f}B "
            f"{m['kv_bytes_per_token_bf16'] / 1024:11.1f} KiB  {m['attention']:9}  {len(m['hf_ids'])}"
        )
    lines += ["", "Hardware", f"  {'id':14} {'unit':>10} {'domain':>7} {'$/chip-h':>9}  HBM"]
    for h in data["hardware"]:
        price = f"{h['price_usd_per_chip_hour']:.2f}" if h["price_usd_per_chip_hour"] else "n/a"
        lines.append(
            f"  {h['id']:14} {h['unit_kind'] + ' ' + str(h['chips_per_unit']):>10} {h['scale_up_domain_chips']:7d} "
            f"{price:>9}  {h['hbm_capacity_gb']:g} GB @ {h['hbm_bandwidth_tb_s']:g} TB/s"
        )
    return "\n".join(lines)
