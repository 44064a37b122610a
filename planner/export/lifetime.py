"""``planner lifetime``'s output: the optimum per lifetime volume as Markdown, JSON and a plot (over-training factor
and total cost against lifetime tokens, one line per family: dense and MoE)."""

from __future__ import annotations

import math
from pathlib import Path

from planner.pipeline.lifetime import Choice, LifetimeInputs, LifetimeRun, SizePoint
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
            "params": p.params if p else None, "active_params": p.active if p else None,
            "effective_params": p.effective if p else None, "model": p.model_id if p else None,
            "train_tokens": p.tokens if p else None,
            "overtrain": p.tokens / p.optimal_tokens if p else None,
            "train_usd": p.train_usd if p else None, "serve_usd": c.serve_usd if p else None,
            "total_usd": c.total_usd if p else None,
            "usd_per_mtok": (c.total_usd / (c.volume * inputs.life_days) * 1e6) if p and c.volume > 0 else None,
            "naive_params": q.params if q else None, "naive_active_params": q.active if q else None,
            "naive_overtrain": q.tokens / q.optimal_tokens if q else None,
            "naive_serve_usd": c.naive_serve_usd if q else None,
            "note": p.note if p else "no size of the grid is served",
        })
    return out


def _size(p: SizePoint, inputs: LifetimeInputs) -> str:
    """A size as the table shows it: a MoE's total with its active parameters."""
    return f"{p.params / 1e9:,.1f}B" + (f" ({p.active / 1e9:,.1f}B active)" if inputs.sparse else "")


def _kind(inputs: LifetimeInputs) -> str:
    if not inputs.sparse:
        return f"{inputs.family} (dense)"
    return f"{inputs.family} (MoE" + (f", top-k of {inputs.experts} experts" if inputs.experts else "") + ")"


def claim(inputs: LifetimeInputs, choices: list[Choice]) -> str:
    """Where, if anywhere on the sweep, the optimum trains ``CLAIM_FACTOR`` times past Chinchilla."""
    hit = next((c for c in choices if c.point and c.point.tokens / c.point.optimal_tokens >= CLAIM_FACTOR), None)
    top = max((c.point.tokens / c.point.optimal_tokens for c in choices if c.point), default=0.0)
    if hit is None:
        return (f"{_kind(inputs)}: on this sweep the optimum never trains {CLAIM_FACTOR:g}x past the compute-optimal "
                f"tokens (at most {top:,.1f}x); the seed's ~{CLAIM_FACTOR:g}x needs more lifetime volume, dearer "
                "serving or cheaper training than this.")
    return (f"{_kind(inputs)}: the optimum trains {hit.point.tokens / hit.point.optimal_tokens:,.0f}x past the "
            f"compute-optimal tokens from {hit.volume:,.3g} tokens a day ({hit.volume * inputs.life_days:,.3g} over "
            f"the life) on: a {_size(hit.point, inputs)} model trained on {hit.point.tokens / 1e12:,.1f}T tokens.")


def header(runs: list[LifetimeRun], scenario: str) -> list[str]:
    inputs = runs[0].inputs
    law = LAWS[inputs.law]
    n_opt, d_opt = law.compute_optimal(inputs.loss)
    sparse = [r.inputs for r in runs if r.inputs.sparse]
    return [f"Loss target {inputs.loss:.4f} under the {law.name} law ({law.source}): compute-optimal at "
            f"{n_opt / 1e9:,.1f}B (effective) parameters on {d_opt / 1e12:,.2f}T tokens. Training on "
            f"{inputs.train_hardware} at {inputs.mfu:.0%} MFU (bf16 peak, 6 N_active D FLOPs); serving the traffic of "
            f"`{scenario}` scaled to each volume, for {inputs.life_days:g} days, at the planner's cheapest plan for "
            "each generated model (its SLOs and hardware)."
            + (f" Unique training tokens: {inputs.unique_tokens:.3g} (repeats priced as Muennighoff et al. 2023)."
               if inputs.unique_tokens else "")
            + (f" A MoE is priced at its effective parameters N_active (N_total / N_active)^{sparse[0].sparse_exponent:g} "
               "(the seed lecture: a hundredfold total parameters is worth tenfold active ones; `--sparse-exponent`)."
               if sparse else ""), ""]


def family_markdown(run: LifetimeRun) -> str:
    """One family's optimum per volume and the sizes it chose among."""
    inputs, points, choices = run.inputs, run.points, run.choices
    L = [f"## {_kind(inputs)}", "", claim(inputs, choices), "",
         "| tokens/day | lifetime tokens | params | train tokens | x Chinchilla | training | serving | total | $/M tokens | "
         "2N-FLOPs optimum (x Chinchilla) |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in choices:
        p, q = c.point, c.naive_point
        if p is None:
            L.append(f"| {c.volume:,.3g} | {c.volume * inputs.life_days:,.3g} | - | - | - | - | - | - | - | "
                     "no size of the grid is served |")
            continue
        per = f"${c.total_usd / (c.volume * inputs.life_days) * 1e6:,.4f}" if c.volume > 0 else ""
        naive = f"{_size(q, inputs)} ({q.tokens / q.optimal_tokens:,.1f}x)" if q else "-"
        L.append(f"| {c.volume:,.3g} | {c.volume * inputs.life_days:,.3g} | {_size(p, inputs)} | "
                 f"{p.tokens / 1e12:,.2f}T | {p.tokens / p.optimal_tokens:,.1f} | {_usd(p.train_usd)} | "
                 f"{_usd(c.serve_usd)} | {_usd(c.total_usd)} | {per} | {naive} |")
    L += ["", f"Sizes considered ({inputs.family}):", "",
          "| params | train tokens | x Chinchilla | training | note |", "|---:|---:|---:|---:|---|"]
    for p in points:
        if not p.model_id:
            L.append(f"| - | - | - | - | {p.note} |")
            continue
        L.append(f"| {_size(p, inputs)} | {p.tokens / 1e12:,.2f}T | {p.tokens / p.optimal_tokens:,.1f} | "
                 f"{_usd(p.train_usd)} | {p.note} |")
    return "\n".join(L) + "\n"


def compare_markdown(runs: list[LifetimeRun]) -> str:
    """The families side by side: where each reaches ``CLAIM_FACTOR`` x, and its optimum at the top volume."""
    L = ["| family | at the lowest volume | first volume at 100x (tokens/day) | at the top volume: params, x Chinchilla | "
         "2N FLOPs/token at the top volume | $/M tokens at the top volume |", "|---|---|---:|---|---|---:|"]
    for r in runs:
        L.append(_summary_row(_kind(r.inputs), r.inputs, r.choices))
    return "\n".join(L) + "\n"


def _summary_row(label: str, inputs: LifetimeInputs, choices: list[Choice]) -> str:
    hit = next((c for c in choices if c.point and c.point.tokens / c.point.optimal_tokens >= CLAIM_FACTOR), None)
    top = next((c for c in reversed(choices) if c.point), None)
    first = next((c.point for c in choices if c.point), None)
    if top is None:
        return f"| {label} | - | - | no size served | - | - |"
    per = top.total_usd / (top.volume * inputs.life_days) * 1e6 if top.volume > 0 else math.nan
    q = top.naive_point
    return (f"| {label} | {_size(first, inputs)} | {'not reached' if hit is None else f'{hit.volume:,.3g}'} | "
            f"{_size(top.point, inputs)}, {top.point.tokens / top.point.optimal_tokens:,.1f}x | "
            f"{_size(q, inputs)}, {q.tokens / q.optimal_tokens:,.1f}x | ${per:,.4f} |")


def lifetime_markdown(runs: list[LifetimeRun], scenario: str, image: str = "lifetime.png") -> str:
    inputs = runs[0].inputs
    law = LAWS[inputs.law]
    L = [f"# Lifetime economics at loss {inputs.loss:.4f} ({law.name} law)", "", *header(runs, scenario)]
    if len(runs) > 1:
        L += [compare_markdown(runs)]
    L += [f"![over-training and total cost against lifetime tokens]({image})", ""]
    for r in runs:
        L.append(family_markdown(r))
        if r.variants:
            L.append(variants_markdown(r))
    L += ["The 2N-FLOPs column prices serving as the published analyses do (Sardana and Frankle 2024): 2 N_active "
          f"FLOPs per token at {inputs.naive_utilisation:.0%} of the cheapest candidate hardware's bf16 peak, whatever "
          "the batch the SLO allows, the KV cache or the scale-up domain.", ""]
    return "\n".join(L)


def lifetime_plot(runs: list[LifetimeRun], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, r in enumerate(runs):
        ok = [c for c in r.choices if c.point and c.volume > 0]
        x = [c.volume * r.inputs.life_days for c in ok]
        colour = f"C{k}"
        ax[0].plot(x, [c.point.tokens / c.point.optimal_tokens for c in ok], "o-", color=colour,
                   label=f"{_kind(r.inputs)}: planner serving cost")
        ax[0].plot(x, [c.naive_point.tokens / c.naive_point.optimal_tokens for c in ok], "s--", color=colour,
                   alpha=0.6, label=f"{r.inputs.family}: 2N FLOPs/token")
        ax[1].plot(x, [c.total_usd / 1e6 for c in ok], "o-", color=colour, label=f"{_kind(r.inputs)}: training + serving")
        ax[1].plot(x, [c.point.train_usd / 1e6 for c in ok], "^:", color=colour, alpha=0.6,
                   label=f"{r.inputs.family}: training")
    ax[0].axhline(CLAIM_FACTOR, color="grey", lw=0.8)
    for a, title, ylab in ((ax[0], "over-training", "train tokens / compute-optimal"), (ax[1], "total cost", "$M")):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("lifetime tokens served")
        a.set_ylabel(ylab)
        a.set_title(title)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def variants_markdown(run: LifetimeRun) -> str:
    """How one family's optimum moves with the serving tier, the scale-up domain and (MoE) the sparsity, and
    against the 2N-FLOPs pricing."""
    L = [f"### How the answer moves: {_kind(run.inputs)}", "",
         "Each row re-runs the sweep with one thing changed: the serving tier, the scale-up domain (the same "
         "Blackwell chips on 8-GPU nodes or 72-GPU racks) or, for a MoE, its experts (top-k kept, so the active "
         "share moves).", "",
         f"| variant | at the lowest volume | first volume at {CLAIM_FACTOR:g}x (tokens/day) | at the top volume: params, x "
         "Chinchilla | 2N FLOPs/token at the top volume | $/M tokens at the top volume |", "|---|---|---:|---|---|---:|"]
    for label, choices in run.variants:
        L.append(_summary_row(label, run.inputs, choices))
    return "\n".join(L) + "\n"


def lifetime_json(runs: list[LifetimeRun]) -> dict:
    inputs = runs[0].inputs
    return {"law": inputs.law, "loss": inputs.loss, "life_days": inputs.life_days,
            "families": [{"family": r.inputs.family, "sparse": r.inputs.sparse, "experts": r.inputs.experts,
                          "rows": rows(r.inputs, r.choices),
                          "sizes": [{"params": p.params, "active_params": p.active, "effective_params": p.effective,
                                     "train_tokens": p.tokens, "optimal_tokens": p.optimal_tokens,
                                     "train_usd": p.train_usd, "note": p.note} for p in r.points],
                          "variants": [{"variant": label, "rows": rows(r.inputs, ch)} for label, ch in r.variants]}
                         for r in runs]}
