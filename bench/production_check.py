"""Published production deployments against the performance model (the catalog's fitted factors, no lookup).

Each case is a deployment an operator published with its layout and its measured throughput; the model predicts
the same layout from physics and the fitted efficiency factors, and the script prints predicted / published. A
plan sizes fleets from exactly these numbers, so a ratio of 0.5 here is a fleet planned twice too large.

Cases (sources in ``../shared/reference/hardware-models.md``: DS6, LMSYS-EP):

- ``ds6-decode``: DeepSeek's V3/R1 service, decode on H800 at attention-DP144 EP144 with 32 redundant experts, two
  micro-batch overlap, MTP (one draft), FP8, mean KV length 4,989 tokens per output token: 14.8k output tokens/s
  per node at 20-22 tokens/s per user (a day's average). Predicted: the largest batch whose per-user speed is at
  least 20 tokens/s.
- ``ds6-prefill``: the same service, prefill on H800 at attention-DP32 EP32 with overlap: 73.7k input tokens/s per
  node *including* on-disk cache hits (56.3% of input tokens). Predicted: prompts of 4,096 tokens of which 56.3%
  are a cached prefix, 16,384 tokens per GPU and pass (the prompt length and pass size are not published).
- ``lmsys-prefill-{1k,2k,4k}``: SGLang on H100 at attention-DP32 EP32 with overlap, 57,674 / 54,543 / 50,302
  input tokens/s per node for 1K / 2K / 4K prompts (16,384 tokens per GPU and pass assumed).
- ``lmsys-decode``: SGLang on H100 at attention-DP72 EP72 (+32 redundant experts), overlap, no MTP, 2K inputs:
  22,282 output tokens/s per node. The batch is not published: predicted at 256 sequences per GPU, or the most
  the KV cache holds (BF16 KV, SGLang's default; the DeepSeek cases use FP8 KV).

Usage: ``python bench/production_check.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog import load_catalog  # noqa: E402
from planner.perf.layout import Layout, expert_copies  # noqa: E402
from planner.perf.report import prefill_roofline, roofline  # noqa: E402
from planner.perf.roofline import Setup  # noqa: E402
from planner.perf.serving import kv_capacity_sequences  # noqa: E402

GPUS_PER_NODE = 8
TOKENS_PER_GPU_PASS = 16384


def _setup(cat, hw: str, *, spec: int = 0, kv: str = "fp8") -> Setup:
    h = cat.hardware[hw]
    return Setup.make(cat.models["deepseek-v3"], h, weights="fp8", kv=kv, eff=h.efficiency.for_engine("sglang"), engine="sglang",
                      spec_tokens=spec, tbo=1.0)


def decode_at_speed(cat, hw: str, layout: Layout, context: float, min_user_tps: float, spec: int) -> dict:
    """Per-node output tokens/s at the largest batch (per GPU, 1 to 512) whose per-user speed meets ``min_user_tps``."""
    setup = _setup(cat, hw, spec=spec)
    best = None
    for per_gpu in range(1, 513):
        r = roofline(setup, layout, per_gpu * layout.chips, context, mode="calibrated", engine="sglang")
        if not r.fits or r.tokens_per_s_per_user < min_user_tps:
            break
        best = (per_gpu, r)
    if best is None:
        return {"predicted": 0.0, "batch_per_gpu": 0, "user_tps": 0.0}
    per_gpu, r = best
    return {"predicted": r.tokens_per_s / layout.chips * GPUS_PER_NODE, "batch_per_gpu": per_gpu,
            "user_tps": r.tokens_per_s_per_user, "step_ms": r.step_time_s * 1e3}


def decode_at_batch(cat, hw: str, layout: Layout, context: float, per_gpu: float) -> dict:
    setup = _setup(cat, hw, kv="bf16")
    s = replace(setup, expert_copies=expert_copies(setup.model, layout.redundant))
    cap = float(np.asarray(kv_capacity_sequences(s, layout.tp, layout.ep, layout.pp, layout.dp, context)))
    batch = min(per_gpu * layout.chips, cap)
    r = roofline(setup, layout, batch, context, mode="calibrated", engine="sglang")
    return {"predicted": r.tokens_per_s / layout.chips * GPUS_PER_NODE, "batch_per_gpu": batch / layout.chips,
            "user_tps": r.tokens_per_s_per_user, "step_ms": r.step_time_s * 1e3}


def prefill(cat, hw: str, layout: Layout, prompt: float, cached_share: float = 0.0) -> dict:
    setup = _setup(cat, hw)
    new = prompt * (1.0 - cached_share)
    prompts = TOKENS_PER_GPU_PASS * layout.chips / new
    r = prefill_roofline(setup, layout, prompts, new, prefix=prompt - new, mode="calibrated", engine="sglang")
    per_node_new = r.tokens_per_s_per_gpu * GPUS_PER_NODE
    return {"predicted": per_node_new * prompt / new, "pass_s": r.pass_time_s,
            "mfu": r.model_flops_utilisation}


def cases(cat) -> list[dict]:
    ep144 = Layout(1, 144, 1, 144, 32)
    ep32 = Layout(1, 32, 1, 32, 0)
    ep72 = Layout(1, 72, 1, 72, 32)
    out = [dict(case="ds6-decode", published=14_800.0, unit="output tok/s/node",
                **decode_at_speed(cat, "h800-sxm", ep144, 4989.0, 20.0, spec=1)),
           dict(case="ds6-prefill", published=73_700.0, unit="input tok/s/node (cache hits included)",
                **prefill(cat, "h800-sxm", ep32, 4096.0, cached_share=0.563))]
    for k, pub in ((1024, 57_674.0), (2048, 54_543.0), (4096, 50_302.0)):
        out.append(dict(case=f"lmsys-prefill-{k // 1024}k", published=pub, unit="input tok/s/node",
                        **prefill(cat, "h100-sxm", ep32, float(k))))
    out.append(dict(case="lmsys-decode", published=22_282.0, unit="output tok/s/node",
                    **decode_at_batch(cat, "h100-sxm", ep72, 2048.0 + 50.0, 256.0)))
    for c in out:
        c["ratio"] = c["predicted"] / c["published"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = cases(load_catalog(ROOT / "catalogs"))
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{'case':<18} {'published':>10} {'predicted':>10} {'ratio':>6}  detail")
    for c in res:
        detail = ", ".join(f"{k} {v:.3g}" for k, v in c.items()
                           if k not in ("case", "published", "predicted", "ratio", "unit") and v is not None)
        print(f"{c['case']:<18} {c['published']:>10,.0f} {c['predicted']:>10,.0f} {c['ratio']:>6.2f}  {c['unit']}; {detail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
