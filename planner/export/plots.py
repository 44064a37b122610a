"""Plots of sweeps and price curves (matplotlib, written as PNG; no display needed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path) -> Path:
    import io

    from planner.catalog.writer import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())
    pyplot().close(fig)
    return path


def _log_scale(values) -> bool:
    v = np.asarray([x for x in values if isinstance(x, (int, float)) and x > 0], dtype=float)
    return v.size > 2 and v.max() / v.min() >= 20


def cost_vs_inputs(df: pd.DataFrame, varied: list[str], path: Path) -> Path:
    """$/M tokens against the first varied input; one line per combination of the others."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = varied[0]
    ok = df[df["status"].isin(["optimal", "feasible"])]
    others = varied[1:]
    groups = ok.groupby(others, sort=True) if others else [((), ok)]
    for key, g in groups:
        g = g.sort_values(x)
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{o.split('.')[-1]}={k:g}" for o, k in zip(others, key, strict=True)) or "cost"
        ax.plot(g[x], g["usd_per_mtok"], marker="o", ms=3, label=label)
    bad = df[~df["status"].isin(["optimal", "feasible"])]
    if len(bad):
        ax.scatter(bad[x], [ok["usd_per_mtok"].min() if len(ok) else 0] * len(bad), marker="x", color="red",
                   label="infeasible")
    if _log_scale(df[x]):
        ax.set_xscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel("$ per million tokens (blended)")
    ax.set_title("Cost against " + x.split(".")[-1])
    ax.grid(alpha=0.3)
    if len(ax.get_legend_handles_labels()[0]) > 1:
        ax.legend(fontsize=7, ncol=2)
    return save_png(fig, path)


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of points no other point beats on both higher ``x`` and lower ``y``, by ``x``."""
    order = np.argsort(-x, kind="stable")
    keep, best = [], math.inf
    for i in order:
        if y[i] < best - 1e-12:
            keep.append(i)
            best = y[i]
    return np.array(sorted(keep, key=lambda i: x[i]), dtype=int)


def pareto(x: np.ndarray, y: np.ndarray, path: Path, *, title: str, ylabel: str = "$ per million output tokens") -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    good = np.isfinite(x) & np.isfinite(y)
    x, y = x[good], y[good]
    ax.scatter(x, y, s=10, alpha=0.4, label="plans")
    front = pareto_front(x, y)
    if len(front):
        ax.plot(x[front], y[front], color="C3", marker="o", ms=4, label="Pareto frontier")
    ax.set_xlabel("interactivity: output tokens/s per user (1 / TPOT)")
    ax.set_ylabel(ylabel)
    if len(y) and y.max() / max(y.min(), 1e-12) > 20:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(fig, path)


def tornado_chart(df: pd.DataFrame, path: Path, swing: float = 0.2) -> Path:
    plt = pyplot()
    d = df.dropna(subset=["usd_per_mtok_low", "usd_per_mtok_high"]).iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.45 * max(len(d), 2) + 1.2))
    base = float(df["usd_per_mtok_base"].iloc[0]) if len(df) else 0.0
    y = np.arange(len(d))
    ax.barh(y, d["usd_per_mtok_low"] - base, left=base, color="C0", label=f"input -{swing:.0%}")
    ax.barh(y, d["usd_per_mtok_high"] - base, left=base, color="C1", alpha=0.8, label=f"input +{swing:.0%}")
    ax.axvline(base, color="k", lw=0.8)
    ax.set_yticks(y, [s.replace("workloads.", "") for s in d["input"]], fontsize=8)
    ax.set_xlabel("$ per million tokens (blended)")
    ax.set_title(f"Sensitivity of cost to each input moved by +-{swing:.0%}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    return save_png(fig, path)


def periods_png(plan) -> bytes:
    """Chips bought per period by tier (stacked bars) under the demand of every workload (line)."""
    import io

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    T = len(plan.periods)
    t = np.arange(T)
    chips = {u.hardware: u.chips_per_unit for p in plan.periods for u in p.units}
    bottom = np.zeros(T)
    for tier in ("reserved", "on_demand", "spot"):
        for h in sorted({u.hardware for p in plan.periods for u in p.units}):
            per = chips[h]
            vals = np.array([sum(getattr(u, tier) for u in p.units if u.hardware == h) * per for p in plan.periods], float)
            if vals.any():
                ax.bar(t, vals, bottom=bottom, label=f"{h} {tier.replace('_', '-')}")
                bottom += vals
    ax.set_xlabel("period")
    ax.set_ylabel("chips bought")
    ax2 = ax.twinx()
    for w in plan.periods[0].requests_per_s:
        ax2.plot(t, [p.requests_per_s[w] for p in plan.periods], "k-", lw=1.5)
    ax2.set_ylabel("requests/s (line)")
    ax.set_title(f"Fleet over the day: \\${plan.usd_per_day:,.0f}/day vs \\${plan.flat_peak_usd_per_day:,.0f} flat at the peak")
    ax.legend(fontsize=7, loc="upper left")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
