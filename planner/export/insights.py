"""insights.md and its plots from :class:`planner.studies.insights.Insights` (every figure computed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from planner.export.plots import pareto_front, pyplot, save_png
from planner.studies.insights import MICRO_BATCH as MICRO
from planner.studies.insights import PRICE_MARGIN


def _f(x, nd=3) -> str:
    if x is None:
        return "none"
    if isinstance(x, str):
        return x
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}g}"


def _ms(s) -> str:
    return f"{s * 1e3:.2f} ms"


def _gb(b) -> str:
    return f"{b / 1e9:.1f}"


def _finish(ax, xlabel: str, ylabel: str, title: str, *, xlog2: bool = False, legend: int = 8) -> None:
    """Log y (and log2 x), labels, grid and legend: the common frame of these plots."""
    if xlog2:
        ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=legend)


def plots(ins, folder: Path, stem: str) -> dict[str, Path]:
    plt = pyplot()
    out = {}
    b = ins.batch
    fig, ax = plt.subplots(figsize=(6.5, 4))
    B = np.array(b["batches"])
    ok = np.array(b["fits"])
    for name, style in (("calibrated", "-o"), ("ideal", "--s")):
        y = np.array(b[f"usd_per_mtok_{name}"])
        ax.plot(B[ok], y[ok], style, ms=3, label=name)
        if (~ok).any():
            ax.plot(B[~ok], y[~ok], "x", color="grey")
    _finish(ax, "batch (sequences in flight per replica)", "$ per million output tokens",
            f"{ins.model} on {ins.hardware}: cost against batch (x: KV does not fit)", xlog2=True, legend=10)
    out["batch"] = save_png(fig, folder / f"{stem}-batch.png")

    lat = ins.latency
    fig, ax = plt.subplots(figsize=(6.5, 4))
    x = np.array(lat["frontier"]["tokens_per_s_per_user"])
    y = np.array(lat["frontier"]["usd_per_mtok_output"])
    f = pareto_front(x, y)
    ax.plot(x[f], y[f], "-o", ms=3, label="cheapest at each interactivity")
    ax.axvline(lat["max_tokens_per_s_per_user"], color="C3", ls="--", label="latency floor (weights / HBM bw)")
    _finish(ax, "output tokens/s per user", "$ per million output tokens", "Cost-latency frontier")
    out["frontier"] = save_png(fig, folder / f"{stem}-frontier.png")

    kv = ins.kv
    fig, ax = plt.subplots(figsize=(6.5, 4))
    S = np.array(kv["contexts"])
    ax.plot(S, kv["weights_memory_s"], "k-", label="weights (this model)")
    ax.plot(S, kv["kv_memory_s"], "-o", ms=3, lw=2, label=f"KV, this model ({kv['attention']})")
    for name, v in kv["variants"].items():
        ax.plot(S, v["kv_memory_s"], "--", label=f"KV, {name}")
    _finish(ax, "context (tokens)", f"memory time per decode step, batch {kv['batch']} (s)",
            "KV-cache against weight traffic", xlog2=True, legend=7)
    out["kv"] = save_png(fig, folder / f"{stem}-kv.png")

    if ins.expert_parallel:
        rows = ins.expert_parallel["rows"]
        fig, ax = plt.subplots(figsize=(6.5, 4))
        labels = [f"{r['gpus']}\n{r['domain']}" for r in rows]
        ax.bar(labels, [r["a2a_s"] * 1e3 for r in rows], color=["C0" if r["domain"] == "inside" else "C3" for r in rows])
        ax.set_ylabel("communication per decode step (ms)")
        ax2 = ax.twinx()
        ax2.plot(labels, [r["usd_per_mtok"] for r in rows], "k-o", ms=3)
        ax2.set_ylabel("$ per million output tokens")
        ax.set_title(f"Expert parallelism inside vs across the {ins.expert_parallel['scale_up_domain']}-GPU domain")
        out["ep"] = save_png(fig, folder / f"{stem}-ep.png")

    lc = ins.long_context
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(lc["contexts"], lc["usd_per_mtok_output"], "-o", ms=3, label="cost (best batch that fits)")
    ax.axhline(lc["flat_price"], color="C3", ls="--", label=f"flat price: {lc['reference_context']:,}-token cost x2")
    _finish(ax, "context (tokens)", "$ per million output tokens", "Cost against context length", xlog2=True)
    out["long_context"] = save_png(fig, folder / f"{stem}-context.png")
    return out


def section(ins, images: dict[str, str]) -> str:
    b, lat, kv, r, lc = ins.batch, ins.latency, ins.kv, ins.ratios, ins.long_context
    L = [f"## {ins.model} on {ins.hardware}", ""]
    L.append(
        f"Reference layout {ins.layout.describe()} ({ins.layout.chips} chips: the smallest whose weights take at most "
        f"60% of HBM), weights {ins.weights_dtype}, KV cache {ins.kv_dtype}, mean context {ins.context:,} tokens, "
        f"${ins.price:.2f} per chip-hour. Calibrated mode uses the fitted efficiency factors; ideal mode "
        "efficiency 1 and no overheads."
    )
    L += ["", "### 1. Batching amortises weight fetches", "", f"![cost against batch]({images['batch']})", ""]
    L.append("| batch | fits | $/M out calibrated | bound | $/M out ideal |")
    L.append("|---:|---|---:|---|---:|")
    for i, B in enumerate(b["batches"]):
        L.append(f"| {B:,} | {'yes' if b['fits'][i] else 'no'} | {_f(b['usd_per_mtok_calibrated'][i])} | "
                 f"{b['bound_calibrated'][i]} | {_f(b['usd_per_mtok_ideal'][i])} |")
    L += ["", f"- Unbatched (batch 1) costs **{_f(b['unbatched_to_best_cost_ratio'])}x** the best batch that fits "
              f"(batch {b['best_batch']:,}).",
          f"- Balance batch (compute time = memory time, ideal, weights only): **{_f(b['balance_batch'])}** sequences; "
          f"at {ins.context:,} tokens of context: "
          + (f"{_f(b['balance_batch_at_context'])}." if b["balance_batch_at_context"] is not None
             else "none (KV traffic keeps the step memory-bound at every batch)."),
          f"- Rule of thumb FLOP/byte x bytes per weight / 2 x total/active = {_f(b['machine_balance_flop_per_byte'])} x "
          f"{_f(b['bytes_per_weight'])} / 2 x {_f(b['sparsity'])} = **{_f(b['balance_batch_rule'])}**. The model's "
          "figure differs where attention FLOPs, expert coverage at small batch (not every expert is touched) and "
          "non-expert weights enter.", ""]
    L += ["### 2. Latency floor and the cost of speed", "", f"![frontier]({images['frontier']})", "",
          f"- Latency floor: resident weights per chip / HBM bandwidth = **{_ms(lat['latency_floor_s'])}** per token at "
          f"{lat['floor_layout']} (at most {_f(lat['max_tokens_per_s_per_user'])} tokens/s per user at any price); "
          f"the fastest evaluated point reaches {_f(lat['fastest_reached'])} tokens/s per user (communication and "
          "overheads add to the floor).", "",
          "| speed (x cost-optimal interactivity) | price multiple |", "|---:|---:|"]
    for t in lat["tiers"]:
        pm = t["price_multiple"]
        L.append(f"| {t['speed_multiple']:.1f}x | {pm if isinstance(pm, str) else f'{pm:.2f}x'} |")
    L += ["", "### 3. KV-cache traffic against weights", "", f"![kv]({images['kv']})", "",
          f"At batch {kv['batch']} per replica, KV reads overtake weight reads at **{_f(kv['crossover_context'])}** "
          f"tokens of context for this model ({kv['attention']}). Same layers and batch, other attention designs:", "",
          "| attention | crossover context (tokens) |", "|---|---:|"]
    for name, v in kv["variants"].items():
        L.append(f"| {name} | {_f(v['crossover_context'])} |")
    L += ["", "### 4. Pipelining saves weight memory, not KV memory", "",
          f"Batch grows with the stages ({MICRO} sequences per stage per attention rank) to keep every stage busy.", "",
          "| pp | chips | batch | weights/chip GB | KV/chip GB | TPOT |", "|---:|---:|---:|---:|---:|---:|"]
    for p in ins.pipeline:
        L.append(f"| {p['pp']} | {p['chips']} | {p['batch']} | {_gb(p['weight_bytes_per_chip'])} | "
                 f"{_gb(p['kv_bytes_per_chip'])} | {_ms(p['tpot_s'])} |")
    L += ["", "### 5. Expert parallelism and the scale-up domain", ""]
    if ins.expert_parallel:
        ep = ins.expert_parallel
        L += [f"![ep]({images['ep']})", "",
              f"{ep['batch_per_gpu']} sequences per GPU, EP = DP = GPUs; beyond {ep['scale_up_domain']} GPUs the "
              "all-to-all crosses the scale-out network.", "",
              "| GPUs | domain | all-to-all per step | step | $/M out |", "|---:|---|---:|---:|---:|"]
        for x in ep["rows"]:
            L.append(f"| {x['gpus']} | {x['domain']} | {_ms(x['a2a_s'])} | {_ms(x['step_s'])} | {_f(x['usd_per_mtok'])} |")
    else:
        L.append("Dense model: no experts to spread.")
    h = r["cache_hit_to_prefill_cost_ratio"]
    L += ["", "### 6. What input, output and cached input cost", "",
          f"- Output token {_f(r['usd_per_mtok_output'])} $/M (batch {r['batch']:,}), fresh input (prefill of "
          f"{r['prefill_prompts']} prompts) {_f(r['usd_per_mtok_input'])} $/M: output/input = **{_f(r['output_to_input_cost_ratio'])}x** "
          "(APIs charge output 4-8x input).",
          f"- Cached input against fresh prefill (loading the cached KV over the tier's bandwidth): HBM "
          f"**{_f(h['hbm'])}x**, host DRAM **{_f(h['host_dram'])}x**, NVMe **{_f(h['nvme'])}x** (APIs charge cache reads "
          "about 0.1x: the price covers holding the cache, which this ratio does not count).", ""]
    L += ["### 7. Cost against context length", "", f"![context]({images['long_context']})", "",
          "| context | $/M out | best batch |", "|---:|---:|---:|"]
    for s, c, bb in zip(lc["contexts"], lc["usd_per_mtok_output"], lc["best_batch"], strict=True):
        L.append(f"| {s:,} | {_f(c) if c == c else 'does not fit'} | {bb if bb else '-'} |")
    step = lc["price_step_context"]
    L += ["", f"A flat price at {PRICE_MARGIN:g}x the {lc['reference_context']:,}-token cost (${_f(lc['flat_price'])}/M) "
              + (f"stops covering cost at **{step:,}** tokens: a long-context price step is needed there." if step
                 else "covers every context that fits."), ""]
    return "\n".join(L)




def write(items, folder: Path, command: str, lifetime=None, scenario: str = "") -> Path:
    """``folder/insights.md`` with plots in ``folder/insights/``; ``lifetime`` (the runs of
    :func:`planner.pipeline.lifetime.run_families` on ``scenario``) computes the lifetime section."""
    from planner.catalog.writer import atomic_write_text

    img = folder / "insights"
    parts = ["# Serving economics, computed", "",
             f"Regenerate: `{command}`. Every number and plot below comes from the performance model "
             "(`planner/perf/`) and the price curve (`planner price-curve`); none is typed in.", ""]
    for ins in items:
        stem = f"{ins.model}-{ins.hardware}"
        paths = plots(ins, img, stem)
        parts.append(section(ins, {k: f"insights/{p.name}" for k, p in paths.items()}))
    parts += ["## How big a model to train, when serving costs what the planner says", ""]
    if lifetime:
        parts.append(lifetime_section(lifetime, scenario, img))
    else:
        parts += ["The lecture's last claim (a model serving enormous traffic is smaller and trained far past "
                  "Chinchilla-optimal) is computed by `planner lifetime`, and here with `--lifetime SCENARIO`.", ""]
    md = folder / "insights.md"
    atomic_write_text(md, "\n".join(parts))
    return md


def lifetime_section(runs, scenario: str, img: Path) -> str:
    """The seed's over-training claim, computed: where each family's optimum reaches ~100x past Chinchilla, how
    the answer moves with the serving tier, the scale-up domain and sparsity, and how far the 2N-FLOPs pricing of the
    published analyses lands from it."""
    from planner.export.lifetime import claim, compare_markdown, header, lifetime_plot, variants_markdown

    img.mkdir(parents=True, exist_ok=True)
    lifetime_plot(runs, img / "lifetime.png")
    L = ["The lecture's last claim: a model that serves enormous traffic should be smaller and trained far past "
         "Chinchilla-optimal (~100x), because serving dwarfs the extra training. Per lifetime volume, the size and "
         "training tokens of least training plus serving cost at one loss target, serving priced by the planner's "
         "own cheapest plan for each generated model (`planner lifetime`, whose report has every volume and size).",
         "", *header(runs, scenario), compare_markdown(runs)]
    L += [f"- {claim(r.inputs, r.choices)}" for r in runs]
    L += ["", "![over-training and total cost against lifetime tokens](insights/lifetime.png)", ""]
    L += [variants_markdown(r) for r in runs if r.variants]
    L += ["The 2N-FLOPs columns price serving as the published analyses do (Sardana and Frankle 2024): 2 N_active "
          f"FLOPs per token at {runs[0].inputs.naive_utilisation:.0%} of the cheapest candidate hardware's bf16 peak. "
          "Where the planner's optimum is smaller (more over-trained) than theirs, real serving is dearer per FLOP "
          "than that assumption (SLO-limited batches, KV memory, whole units); where larger, cheaper.", ""]
    return "\n".join(L)


def command(pairs: list[tuple[str, str]], out: Path, context: int = 2048, lifetime: list[str] | None = None) -> str:
    """The command line that regenerates an insights document (``lifetime``: its lifetime options)."""
    args = " ".join(f"--model {m} --hardware {h}" for m, h in pairs)
    return (f"planner insights {args} --out {out} --force" + (f" --context {context}" if context != 2048 else "")
            + ("".join(f" {a}" for a in lifetime) if lifetime else ""))
