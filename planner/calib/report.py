"""The validation report (docs/validation.md): error tables, residual plots and cross-validation, for the
measured files of either format together.

Regenerate with ``planner calibrate report --data ../shared/calibration/silicon_calibration.csv --data
../shared/calibration/inferencex/dsr1_runs.json``.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from planner.calib.data import Measured, load_measured
from planner.calib.fit import MIN_ROWS, PAIR_FREE, PHYSICS_PRIOR, efficiency_blocks, fit_norm, prepare
from planner.calib.metrics import CONC_BANDS, evaluation_frame, format_table, format_tail_table, summary_rows
from planner.calib.predict import SPEC_TOKENS_ASSUMED, notes, predict_normalised
from planner.calib.shared import SHARED_TPOT_TOL, shared_runs
from planner.catalog import Catalog
from planner.catalog.writer import atomic_write_text

TARGETS = {
    "inferencex": "targets: TPOT median <= 12%, p90 <= 35%; output tok/s/GPU median <= 15%; TTFT median <= 30%; "
                  ">= 95% predicted; leave-one-hardware-out TPOT median <= 18%",
    "silicon": "reference before this model: TPOT 15.4% / 47.6%, TTFT 24.7% / 90.8% (median / p90)",
}


def _predict_with(blocks, catalog: Catalog, norm: pd.DataFrame) -> pd.DataFrame:
    def eff_for(h, e):
        b = blocks[h]
        return b.by_engine.get(e, b.default)

    return predict_normalised(norm, catalog, eff_for)


def _fold(args):
    """One cross-validation fold (run in a worker process): fit without the held-out rows, predict them with
    the factors the catalog would then give (transferred, for held-out hardware)."""
    norm, catalog, key, val = args
    train = norm[norm[key] != val]
    res = fit_norm(train, catalog)
    blocks = efficiency_blocks(res, catalog, "cross-validation")
    test = norm[norm[key] == val]
    p = _predict_with(blocks, catalog, test)
    return test.index, p


def held_out(sets: list[Measured], catalog: Catalog, key: str, *, values=None, jobs: int = 2) -> dict[str, pd.DataFrame]:
    """Predict every fittable row of each value of ``key`` (``n_hw``, ``n_model``) with factors fitted on the
    rows of the other values only (both files together); returns one evaluation frame per file."""
    norm, _ = prepare(sets, catalog)
    vals = sorted(norm[key].unique()) if values is None else values
    args = [(norm, catalog, key, v) for v in vals]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            results = list(ex.map(_fold, args))
    else:
        results = [_fold(a) for a in args]
    return per_file_frames(sets, norm, pd.concat([p.set_axis(idx) for idx, p in results]))


def per_file_frames(sets: list[Measured], norm: pd.DataFrame, pred: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The evaluation frame of each file's rows among ``pred`` (predictions indexed as ``norm``, both files
    prepared together)."""
    out = {}
    for m in sets:
        mine = norm.loc[pred.index][norm.loc[pred.index, "src"] == m.path.name]
        if mine.empty:
            continue
        rows = mine["row_in_file"].to_numpy()
        sub = Measured(m.path, m.fmt, m.raw.loc[rows], m.norm.loc[rows])
        out[m.path.name] = evaluation_frame(sub, pred.loc[mine.index].set_axis(rows))
    return out


def _plot(frames: dict[str, pd.DataFrame], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(frames), 3, figsize=(16, 5 * len(frames)), squeeze=False)
    for i, (name, f) in enumerate(frames.items()):
        for j, (metric, label) in enumerate((("tpot", "TPOT ms"), ("ttft", "TTFT ms"), ("otpg", "output tok/s/GPU"))):
            ax = axes[i, j]
            g = f[f[f"predicted_{metric}"].notna() & f[f"measured_{metric}"].notna()]
            if g.empty:
                ax.set_visible(False)
                continue
            for sysname, h in g.groupby("system"):
                ax.scatter(h[f"measured_{metric}"], h[f"predicted_{metric}"], s=6, alpha=0.5, label=sysname)
            lo = float(np.nanmin([g[f"measured_{metric}"].min(), g[f"predicted_{metric}"].min()]))
            hi = float(np.nanmax([g[f"measured_{metric}"].max(), g[f"predicted_{metric}"].max()]))
            ax.plot([lo, hi], [lo, hi], "k-", lw=1)
            ax.plot([lo, hi], [lo * 1.25, hi * 1.25], "k:", lw=0.8)
            ax.plot([lo, hi], [lo / 1.25, hi / 1.25], "k:", lw=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(f"measured {label}")
            ax.set_ylabel(f"predicted {label}")
            ax.set_title(f"{name}: {label} (dotted: +-25%)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _unpredicted(frame: pd.DataFrame) -> list[str]:
    """One line per kind of reason rows got no prediction (numbers in the reason read as N)."""
    miss = frame["predicted_tpot"].isna()
    if not miss.any():
        return []
    kinds = frame.loc[miss, "note"].astype(str).str.replace(r"\b\d+(\.\d+)?\b", "N", regex=True).value_counts()
    return [f"  - {n} rows: {k}" for k, n in kinds.items()]


def _headline(name: str, fmt: str, frame: pd.DataFrame) -> list[str]:
    o = summary_rows(frame, None)[0]
    lines = [
        f"### {name}",
        "",
        f"- Rows: {o['rows']}, predicted: {o['predicted']} ({100 * o['coverage']:.1f}%).",
        *_unpredicted(frame),
        f"- TPOT: median {100 * o['tpot_median_ape']:.1f}%, p90 {100 * o['tpot_p90_ape']:.1f}%.",
        f"- TTFT: median {100 * o['ttft_median_ape']:.1f}%, p90 {100 * o['ttft_p90_ape']:.1f}%.",
    ]
    if np.isfinite(o["otpg_median_ape"]):
        lines.append(f"- Output throughput per GPU: median {100 * o['otpg_median_ape']:.1f}%, p90 {100 * o['otpg_p90_ape']:.1f}%.")
    lines += [f"- {TARGETS[fmt]}.", ""]
    return lines


def _tables(frame: pd.DataFrame, fmt: str) -> list[str]:
    parts = []
    groups = [("system", ["system"]), ("engine", ["engine"]), ("serving mode", ["mode"]),
              ("speculative decoding", ["spec"]), ("concurrency band", ["conc_band"]),
              ("system and engine", ["system", "engine"])]
    if fmt == "inferencex":
        groups.insert(2, ("framework (as the benchmark names it)", ["framework"]))
        groups.append(("request lengths", ["lengths"]))
    else:
        groups.append(("model and mode", ["model", "mode"]))
        groups.insert(0, ("configuration recorded", ["complete"]))
    for title, cols in groups:
        parts += [f"Per {title}:", "", format_table(summary_rows(frame, cols), cols), ""]
    tails = format_tail_table(summary_rows(frame, None), [])
    if tails:
        parts += ["Tails beside the medians (p99 TTFT and TPOT, median and p99 ITL; `perf/latency.py` and "
                  "`calib/predict.py::_closed_tails`):", "", tails, ""]
        for cols in (["mode"], ["spec"], ["framework"]):
            parts += [format_tail_table(summary_rows(frame, cols), cols), ""]
    return parts


def _drivers(frame: pd.DataFrame) -> str:
    f = frame[frame["predicted_tpot"].notna()].copy()
    lines = [
        "Median signed error (positive: predicted too slow, or throughput too high) by concurrency band and mode:",
        "",
        "| mode | concurrency | rows | TPOT bias | TTFT bias | tok/s/GPU bias |",
        "|---|---|---|---|---|---|",
    ]
    for (mode, band), g in f.groupby(["mode", "conc_band"], observed=True):
        lines.append(f"| {mode} | {band} | {len(g)} | {_bias(g, 'tpot')} | {_bias(g, 'ttft')} | {_bias(g, 'otpg')} |")
    return "\n".join(lines)


def _shared_table(sets, frames) -> list[str]:
    sil = next((m for m in sets if m.fmt == "silicon"), None)
    ix = next((m for m in sets if m.fmt == "inferencex"), None)
    if sil is None or ix is None:
        return []
    shared = shared_runs(sil, ix)
    if shared.empty:
        return []
    f = frames[sil.path.name].loc[shared.index].assign(spec_method=shared["spec_method"])
    rows = summary_rows(f, ["spec_method"])
    return [
        "## Runs recorded in both files",
        "",
        f"{len(shared)} rows of {sil.path.name} are runs of {ix.path.name} exported twice (same configuration, "
        f"date and measured TPOT within {100 * SHARED_TPOT_TOL:.0f}%). The silicon format does not record "
        "speculative decoding; InferenceX does. Errors of those silicon rows (predicted with speculative decoding "
        "off, as their file states nothing) by what InferenceX records:",
        "",
        format_table(rows, ["spec_method"]),
        "",
        "The silicon file's DeepSeek-R1 rows from this benchmark mix runs with and without MTP under one "
        "configuration, so part of its TPOT tail is a field the file lacks, not the model.",
        "",
    ]


def _bias(g: pd.DataFrame, m: str) -> str:
    """Median signed error of metric ``m`` over the rows of ``g``."""
    r = np.log(g[f"predicted_{m}"] / g[f"measured_{m}"]).dropna()
    return f"{100 * (np.exp(r.median()) - 1):+.0f}%" if len(r) else "n/a"


def repeatability(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of a silicon file whose recorded inputs are identical but whose measurements differ: one row per
    such group with the max / min ratio of measured TPOT and TTFT. No predictor that sees only the recorded
    columns can do better on these rows than splitting each ratio."""
    conc = df["silicon_data_source"].astype(str).str.extract(r"silicon_concurrency=(\d+)")[0] \
        if "silicon_data_source" in df.columns else pd.Series("", index=df.index)
    skip = {"id", "silicon_data_source", "silicon_ttft_ms", "silicon_tpot_ms", "backend_version"}
    keys = [c for c in df.columns if c not in skip]
    k = df[keys].apply(lambda c: c.map(str)).agg("|".join, axis=1) + "|" + conc.map(str)
    return _ratios(df, k, "silicon_tpot_ms", "silicon_ttft_ms", None)


def repeatability_runs(raw: pd.DataFrame) -> pd.DataFrame:
    """Repeated InferenceX runs of one configuration (same hardware, framework, precision, speculative
    decoding, layouts, worker and GPU counts, lengths and concurrency) on different dates."""
    keys = ["hardware", "framework", "precision", "spec_method", "disagg", "prefill_tp", "prefill_ep",
            "prefill_dp_attention", "prefill_num_workers", "decode_tp", "decode_ep", "decode_dp_attention",
            "decode_num_workers", "num_prefill_gpu", "num_decode_gpu", "isl", "osl", "conc"]
    k = raw[keys].apply(lambda c: c.map(str)).agg("|".join, axis=1)
    df = raw.assign(mode=np.where(raw["disagg"].astype(str) == "True", "disagg", "agg"))
    return _ratios(df, k, "metrics.median_tpot", "metrics.median_ttft", "metrics.output_tput_per_gpu")


def _ratios(df, key, tpot, ttft, tput) -> pd.DataFrame:
    rows = []
    for _, g in df.groupby(key, sort=False):
        t = pd.to_numeric(g[tpot], errors="coerce")
        f = pd.to_numeric(g[ttft], errors="coerce")
        if len(g) < 2 or (t.nunique() < 2 and f.nunique() < 2) or not (t > 0).all() or not (f > 0).all():
            continue
        row = {"mode": str(g["mode"].iloc[0]), "rows": len(g), "tpot_ratio": t.max() / t.min(), "ttft_ratio": f.max() / f.min()}
        if tput is not None:
            x = pd.to_numeric(g[tput], errors="coerce")
            row["tput_ratio"] = x.max() / x.min() if (x > 0).all() else np.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["mode", "rows", "tpot_ratio", "ttft_ratio"] + (["tput_ratio"] if tput else []))


def _repeatability_table(rep: pd.DataFrame, label: str) -> str:
    if rep.empty:
        return f"No configuration of {label} is recorded twice with different measurements."
    tput = "tput_ratio" in rep.columns
    head = "| mode | groups | rows | TPOT max/min median | TPOT p90 | TTFT max/min median | TTFT p90 |" + (
        " tok/s/GPU max/min median | tok/s/GPU p90 |" if tput else "")
    lines = [head, "|" + "---|" * (7 + (2 if tput else 0))]
    for mode, g in rep.groupby("mode"):
        cells = [mode, str(len(g)), str(int(g["rows"].sum())), f"{g['tpot_ratio'].median():.2f}",
                 f"{g['tpot_ratio'].quantile(0.9):.2f}", f"{g['ttft_ratio'].median():.2f}", f"{g['ttft_ratio'].quantile(0.9):.2f}"]
        if tput:
            cells += [f"{g['tput_ratio'].median():.2f}", f"{g['tput_ratio'].quantile(0.9):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


FACTOR_COLUMNS = (
    ("compute", "bf16", ".2f"), ("compute_fp8", "fp8", ".2f"), ("compute_fp4", "fp4", ".2f"),
    ("gemm_half_tokens", "half-eff. rows", ".0f"), ("attention_compute", "attn", ".2f"),
    ("prefill_compute", "prefill", ".2f"), ("memory", "memory", ".2f"), ("layer_overhead_us", "layer us", ".0f"),
    ("moe_layer_overhead_us", "MoE layer us", ".0f"), ("seq_overhead_us", "seq us", ".0f"),
    ("collective_latency_us", "coll. us", ".0f"), ("scale_out_latency_us", "scale-out us", ".0f"),
    ("prefill_comm_bandwidth", "prefill comm", ".2f"), ("comm_overlap", "overlap", ".2f"),
    ("spec_accept_scale", "accept", ".2f"), ("draft_overhead_us", "draft us", ".0f"), ("interference", "interf.", ".2f"),
    ("attn_dp_wait_steps", "ADP wait", ".0f"), ("first_token_steps", "1st-token steps", ".1f"), ("queueing", "queue", ".3f"), ("ttft_overhead_ms", "TTFT ms", ".0f"),
    ("prefill_expert_overhead_us", "prefill us/expert-layer", ".1f"), ("first_wave_s", "1st-wave s", ".2f"),
)


def _factors_table(catalog: Catalog) -> str:
    head = ["hardware", "engine", "rows", "own"] + [label for _, label, _ in FACTOR_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for h in catalog.hardware.values():
        effs = [("default", h.efficiency.default, h.efficiency.fitted_rows)] + [
            (eng, e, h.efficiency.engine_rows.get(eng, 0)) for eng, e in sorted(h.efficiency.by_engine.items())]
        for eng, e, n in effs:
            own = h.efficiency.free_factors.get(eng)
            cells = [h.id, eng, str(n), "-" if own is None else str(len(own))]
            cells += [format(getattr(e, k), f) for k, _, f in FACTOR_COLUMNS]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Per-engine rows are fitted where a system has at least {MIN_ROWS} rows of that engine, with at most "
              f"{PAIR_FREE} factors of their own (column own: `free_factors` in the hardware file); the rest are the "
              "hardware's silicon and link factors over all its engines and the engine's over all hardware. Physical "
              "expectations the fit is pulled toward: " + ", ".join(f"{k} {v:g}" for k, v in PHYSICS_PRIOR.items()) + "."]
    transferred = [f"{h.id} from {h.efficiency.transferred_from}" for h in catalog.hardware.values()
                   if h.efficiency.transferred_from]
    if transferred:
        lines += ["", "Transferred (no measured rows of their own; plans flag them unvalidated): " + "; ".join(transferred) + "."]
    return "\n".join(lines)


def _kernel_table(catalog: Catalog) -> list[str]:
    """Kernel curves per hardware and family from the catalog: curves, rows, and the row-weighted mean of the
    curves' median APE on all rows and on held-out shapes (``docs/kernels.md`` has the pooled medians, per-row
    residual plots and the command that regenerates them)."""
    from planner.calib.kernel_report import FAMILY_TITLES

    lines = ["| hardware | family | curves | rows | median APE (row-weighted) | held-out median APE |", "|---|---|---|---|---|---|"]
    any_ = False
    for h in catalog.hardware.values():
        kf = h.efficiency.kernels
        if kf is None:
            continue
        fams: dict[str, list] = {}
        for key, c in kf.curves.items():
            fams.setdefault(key.split("/", 1)[0], []).append(c)
        for fam, cs in fams.items():
            any_ = True
            rows = sum(c.rows for c in cs)
            fit = sum(c.rows * c.fit_mape for c in cs) / rows
            held = [c for c in cs if c.holdout_mape is not None]
            hrows = sum(c.holdout_rows for c in held)
            hmape = f"{100 * sum(c.holdout_rows * c.holdout_mape for c in held) / hrows:.1f}%" if hrows else "n/a"
            lines.append(f"| {h.id} | {FAMILY_TITLES.get(fam, fam)} | {len(cs)} | {rows:,} | {100 * fit:.1f}% | {hmape} |")
    over = [f"{h.id}: {', '.join(h.efficiency.kernels.overruled)}" for h in catalog.hardware.values()
            if h.efficiency.kernels is not None and h.efficiency.kernels.overruled]
    if over:
        lines += ["", "Fused-MoE curves the engines' own measured steps overrule (their MoE time alone exceeds the measured "
                  "step, TPOT x (1 + drafts), on more than a tenth of the engine's rows; those engines' MoE layers keep the roofline, "
                  "`planner.calib.consistency`): " + "; ".join(over) + "."]
    return lines if any_ else []


def plot_name(out: Path) -> str:
    """File name of the residual plot written beside the report."""
    return Path(out).stem + "-residuals.png"


def write_report(catalog: Catalog, data, out: Path | str, *, cross_validate: bool = True, jobs: int = 2,
                 folds: tuple[str, ...] = ("hardware", "model")) -> None:
    paths = [Path(p) for p in (data if isinstance(data, (list, tuple)) else [data])]
    out = Path(out)
    sets = [load_measured(p, catalog, measured=True) for p in paths]
    frames: dict[str, pd.DataFrame] = {}
    for m in sets:
        pred = predict_normalised(m.norm, catalog)
        frames[m.path.name] = evaluation_frame(m, pred, notes(m.norm, pred, catalog, m.fmt))
    plot_path = out.with_name(plot_name(out))
    _plot(frames, plot_path)
    cmd = "planner calibrate report " + " ".join(f"--data {p}" for p in paths)
    parts = [
        "# Validation of the performance model",
        "",
        f"Generated by `{cmd}` on {dt.date.today()} from the catalog's current efficiency factors (fitted by "
        f"`planner calibrate fit` on the same files). Predictions come from physics (`planner/perf/`) and the "
        "fitted factors in each hardware file's `efficiency` block only; no measured row is looked up. The metric is "
        "the absolute percentage error `|predicted / measured - 1|` per row, of TPOT, TTFT and, where the file "
        "records it, output throughput per GPU (what a deployment buys). Concurrency bands: "
        + ", ".join(CONC_BANDS[1]) + " requests in flight.",
        "",
        "## Headline (in-sample: the factors were fitted on these rows)",
        "",
    ]
    for m in sets:
        parts += _headline(m.path.name, m.fmt, frames[m.path.name])
    parts += ["The cross-validation below is the honest estimate for data the project has not seen.", ""]
    kt = _kernel_table(catalog)
    if kt:
        parts += ["## Kernel curves (the terms of the step, fitted on measured kernels)", "",
                  "Where a hardware's kernel block says `compose: true`, its decode step and prefill GEMMs are "
                  "composed from these curves (`docs/performance-model.md`) and only the end-to-end factors that "
                  "kernels cannot see are fitted on the rows above; elsewhere the curves are stored and reported. Per "
                  "family, the curves' error on measured kernel latencies (all rows, and shapes held "
                  "out of a second fit); `docs/kernels.md` (`planner calibrate kernels --data "
                  "../shared/calibration/kernels --report docs/kernels.md`) has pooled medians, p90 and residual plots.",
                  "", *kt, ""]
    if cross_validate and "hardware" in folds:
        hw_cv = held_out(sets, catalog, "n_hw", jobs=jobs)
        parts += [
            "## Cross-validation: hardware the fit has not seen",
            "",
            "Leave one hardware out: every row of that hardware (both files) is left out of the fit, and its rows are "
            "predicted with the factors the catalog gives hardware without measured rows (its measured relative's, "
            "else the all-hardware fit), as for H800, B300 or MI325X in plans. A held-out hardware with kernel curves "
            "keeps them (they come from its kernel measurements, not from serving rows), so this asks whether a GPU with "
            "kernel rows only is predicted end to end: its end-to-end factors come from the fit over the other "
            "kernel-composed hardware.",
            "",
        ]
        for name, f in hw_cv.items():
            parts += [f"{name}:", "", format_table(summary_rows(f, None), []), "",
                      format_table(summary_rows(f, ["system"]), ["system"]), ""]
            tails = format_tail_table(summary_rows(f, None), [])
            if tails:
                parts += ["Its tails:", "", tails, "", format_tail_table(summary_rows(f, ["system"]), ["system"]), ""]
    if cross_validate and "model" in folds:
        sil = [m for m in sets if m.fmt == "silicon"]
        if sil:
            model_cv = held_out(sets, catalog, "n_model", values=sorted(prepare(sil, catalog)[0]["n_model"].unique()),
                                jobs=jobs)
            parts += [
                "## Cross-validation: models the fit has not seen",
                "",
                "Leave one model out: the factors are refitted without any row of that model, then its rows are "
                "predicted. This is the estimate that matters for new models (the InferenceX file holds DeepSeek-R1 "
                "only, so its rows are held out with DeepSeek's).",
                "",
            ]
            for name, f in model_cv.items():
                parts += [f"{name}:", "", format_table(summary_rows(f, None), []), "",
                          format_table(summary_rows(f, ["model"]), ["model"]), ""]
    for m in sets:
        parts += [f"## {m.path.name}: errors by group", ""] + _tables(frames[m.path.name], m.fmt)
    parts += _shared_table(sets, frames)
    parts += [f"![residuals]({plot_path.name})", "", "## How repeatable the measured rows are", ""]
    for m in sets:
        rep = repeatability(m.raw) if m.fmt == "silicon" else repeatability_runs(m.raw)
        parts += [f"{m.path.name}: configurations recorded more than once (repeat runs, other dates) and the spread "
                  "of their measurements, a floor no predictor of the recorded fields can beat:", "",
                  _repeatability_table(rep, m.path.name), ""]
    parts += ["## What drives the error", ""]
    for m in sets:
        parts += [f"{m.path.name}:", "", _drivers(frames[m.path.name]), ""]
    parts += [
        "Known limits: benchmark TTFT depends on how the client releases requests and on scheduler settings the "
        "rows do not record (chunk size, max batch tokens, TensorRT-LLM's attention-DP balancing, SGLang's max "
        "running requests); InferenceX does not record its MTP draft count, KV format or redundant experts, which "
        "are read from its launch scripts (`planner/calib/inferencex.py`); silicon disaggregated rows without "
        "worker counts are read as a balanced, tuned deployment (decode workers to hold the concurrency, "
        "rate-matched prefill, the fastest of TP/DP attention with and without speculative decoding of "
        f"{SPEC_TOKENS_ASSUMED:g} drafts); expert routing is assumed uniform in these predictions (imbalance from "
        "random routing only).",
        "",
        "## Fitted factors",
        "",
        _factors_table(catalog),
        "",
    ]
    atomic_write_text(out, "\n".join(parts) + "\n")
