"""``planner lifetime``'s output: the optimum per lifetime volume as Markdown, JSON and a plot (over-training factor
and total cost against lifetime tokens)."""

from __future__ import annotations

import math
from pathlib import Path

from planner.pipeline.lifetime import Choice, LifetimeInputs, SizePoint
from planner.studies.scaling import LAWS

CLAIM_FACTOR = 100.0
"""The seed's claim: models serving enormous traffic train about 100x past the Chinchilla-optimal tokens."""


def _usd(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"${x / 1e6:,.2f}M" if abs(x) >= 1e6 else f"${x:,.0f}"


def rows(inputs: LifetimeInputs, choices: list[Choice]) -> list[dict]:
    """One row per lifetime volume: the optimum and the ``2 N`` FLOPs assumption's."""
    out = []
    for c in choices:
        p, q = c.point, c.naive_point
        out.append({
            "tokens_per_day": c.volume, "lifetime_tokens": c.volume * inputs.life_days,
            "params": p.params if p else None, "model": p.model_id if p else None,
            "train_tokens": p.tokens if p else None,
            "overtrain": p.tokens / p.optimal_tokens if p else None,
            "train_usd": p.train_usd if p else None, "serve_usd": c.serve_usd if p else None,
            "total_usd": c.total_usd if p else None,
            "usd_per_mtok": (c.total_usd / (c.volume * inputs.life_days) * 1e6) if p and c.volume > 0 else None,
            "naive_params": q.params if q else None,
            "naive_overtrain": q.tokens / q.optimal_tokens if q else None,
            "naive_serve_usd": c.naive_serve_usd if q else None,
            "note": p.note if p else "no size of the grid is served",
        })
    return out


def claim(inputs: LifetimeInputs, choices: list[Choice]) -> str:
    """Where, if anywhere on the sweep, the optimum trains ``CLAIM_FACTOR`` times past Chinchilla."""
    hit = next((c for c in choices if c.point and c.point.tokens / c.point.optimal_tokens >= CLAIM_FACTOR), None)
    top = max((c.point.tokens / c.point.optimal_tokens for c in choices if c.point), default=0.0)
    if hit is None:
        return (f"On this sweep the optimum never trains {CLAIM_FACTOR:g}x past the compute-optimal tokens (at most "
                f"{top:,.1f}x); the seed's ~{CLAIM_FACTOR:g}x needs more lifetime volume, dearer serving or cheaper "
                "training than this.")
    return (f"The optimum trains {hit.point.tokens / hit.point.optimal_tokens:,.0f}x past the compute-optimal tokens "
            f"from {hit.volume:,.3g} tokens a day ({hit.volume * inputs.life_days:,.3g} over the life) on: a "
            f"{hit.point.params / 1e9:,.1f}B model trained on {hit.point.tokens / 1e12:,.1f}T tokens.")


def lifetime_markdown(inputs: LifetimeInputs, scenario: str, points: list[SizePoint], choices: list[Choice]) -> str:
    law = LAWS[inputs.law]
    n_opt, d_opt = law.compute_optimal(inputs.loss)
    L = [f"# Lifetime economics: {inputs.family} at loss {inputs.loss:.4f} ({law.name} law)", "",
         f"Loss target {inputs.loss:.4f} under the {law.name} law ({law.source}): compute-optimal at "
         f"{n_opt / 1e9:,.1f}B parameters on {d_opt / 1e12:,.2f}T tokens. Training on {inputs.train_hardware} at "
         f"{inputs.mfu:.0%} MFU (bf16 peak, 6 N D FLOPs); serving the traffic of `{scenario}` scaled to each volume, "
         f"for {inputs.life_days:g} days, at the planner's cheapest plan for each generated model (its SLOs and "
         "hardware)." + (f" Unique training tokens: {inputs.unique_tokens:.3g} (repeats priced as Muennighoff et al. "
                         "2023)." if inputs.unique_tokens else ""), "",
         claim(inputs, choices), "",
         "| tokens/day | lifetime tokens | params | train tokens | x Chinchilla | training | serving | total | $/M tokens | "
         "2N-FLOPs optimum (x Chinchilla) |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows(inputs, choices):
        if r["params"] is None:
            L.append(f"| {r['tokens_per_day']:,.3g} | {r['lifetime_tokens']:,.3g} | - | - | - | - | - | - | - | {r['note']} |")
            continue
        naive = (f"{r['naive_params'] / 1e9:,.1f}B ({r['naive_overtrain']:,.1f}x)" if r["naive_params"] else "-")
        per = "" if r["usd_per_mtok"] is None else f"${r['usd_per_mtok']:,.4f}"
        L.append(f"| {r['tokens_per_day']:,.3g} | {r['lifetime_tokens']:,.3g} | {r['params'] / 1e9:,.1f}B | "
                 f"{r['train_tokens'] / 1e12:,.2f}T | {r['overtrain']:,.1f} | {_usd(r['train_usd'])} | "
                 f"{_usd(r['serve_usd'])} | {_usd(r['total_usd'])} | {per} | {naive} |")
    L += ["", "![over-training and total cost against lifetime tokens](lifetime.png)", "",
          "## Sizes considered", "",
          "| params | train tokens | x Chinchilla | training | note |", "|---:|---:|---:|---:|---|"]
    for p in points:
        L.append(f"| {p.params / 1e9:,.1f}B | {p.tokens / 1e12:,.2f}T | {p.tokens / p.optimal_tokens:,.1f} | "
                 f"{_usd(p.train_usd)} | {p.note} |")
    L += ["", "The 2N-FLOPs column prices serving as the published analyses do (Sardana and Frankle 2024): 2 N FLOPs "
          f"per token at {inputs.naive_utilisation:.0%} of the cheapest candidate hardware's bf16 peak, whatever the "
          "batch the SLO allows, the KV cache or the scale-up domain.", ""]
    return "\n".join(L)


def lifetime_plot(inputs: LifetimeInputs, choices: list[Choice], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [c for c in choices if c.point and c.volume > 0]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    x = [c.volume * inputs.life_days for c in ok]
    ax[0].plot(x, [c.point.tokens / c.point.optimal_tokens for c in ok], "o-", label="planner serving cost")
    ax[0].plot(x, [c.naive_point.tokens / c.naive_point.optimal_tokens for c in ok], "s--", label="2N FLOPs/token")
    ax[0].axhline(CLAIM_FACTOR, color="grey", lw=0.8)
    ax[1].plot(x, [c.total_usd / 1e6 for c in ok], "o-", label="training + serving")
    ax[1].plot(x, [c.point.train_usd / 1e6 for c in ok], "^:", label="training")
    for a, title, ylab in ((ax[0], "over-training", "train tokens / compute-optimal"), (ax[1], "total cost", "$M")):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("lifetime tokens served")
        a.set_ylabel(ylab)
        a.set_title(f"{inputs.family}: {title}")
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def variants_markdown(inputs: LifetimeInputs, found: list[tuple[str, list[Choice]]]) -> str:
    """How the optimum moves with the serving tier and the scale-up domain, and against the 2N-FLOPs pricing."""
    L = ["## How the answer moves", "",
         "Each row re-runs the sweep with the serving side changed. Sparsity (an MoE family) is not among them: it "
         "needs a MoE scaling law planner lifetime does not carry yet.", "",
         f"| serving | first volume at {CLAIM_FACTOR:g}x (tokens/day) | at the top volume: params, x Chinchilla | "
         "2N FLOPs/token at the top volume | $/M tokens at the top volume |", "|---|---:|---|---|---:|"]
    for label, choices in found:
        hit = next((c for c in choices if c.point and c.point.tokens / c.point.optimal_tokens >= CLAIM_FACTOR), None)
        top = next((c for c in reversed(choices) if c.point), None)
        if top is None:
            L.append(f"| {label} | - | no size served | - | - |")
            continue
        per = top.total_usd / (top.volume * inputs.life_days) * 1e6 if top.volume > 0 else math.nan
        q = top.naive_point
        L.append(f"| {label} | {'not reached' if hit is None else f'{hit.volume:,.3g}'} | "
                 f"{top.point.params / 1e9:,.1f}B, {top.point.tokens / top.point.optimal_tokens:,.1f}x | "
                 f"{q.params / 1e9:,.1f}B, {q.tokens / q.optimal_tokens:,.1f}x | ${per:,.4f} |")
    return "\n".join(L) + "\n"
