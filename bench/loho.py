"""Leave one hardware out: which transfer predicts a chip without rows better (issue 42).

Each fold refits the end-to-end factors without one hardware's rows (both files together, as
``planner calibrate report --folds hardware`` does) and predicts that hardware's rows twice from the same fit:

- ``all-hardware``: the catalog's rule for a chip without rows and without a listed relative
  (``planner.calib.fit.efficiency_blocks``; its ``FAMILY`` list names H800, B300, GB300 and MI325X only): the fit over
  every other hardware;
- ``sibling``: the experiment, the fitted block of its nearest measured sibling (:func:`sibling`: the same
  architecture, else the same vendor, nearest by HBM bandwidth, bf16 peak and scale-up domain in log ratio);
- ``hybrid`` (:func:`hybrid`): the all-hardware block with the sibling's kernel and link factors (GEMM, attention,
  memory, prefill compute and links, fitted over all the sibling's engines).

Measured on 2026-11-26 (``bench/data/loho_sibling_vs_allhw.txt``, 35 min on 2 cores): the sibling is worse on the
whole (InferenceX TPOT median 21.4% against 17.4%, silicon TTFT 71.1% against 31.5%), so the catalog keeps the
all-hardware fit: one chip's ~25 fitted factors carry its own rows' idiosyncrasies, which the pooled fit averages out.
The hybrid, measured on the catalog after the attention-DP chunk physics (``bench/data/loho_after_adp_chunks.txt``), is
worse too: InferenceX TPOT median 19.2% against 17.3%, silicon 17.3% against 17.2%.

Since the silicon factors from kernels (``planner.calib.silicon``), the all-hardware rule gives a held-out chip with
kernel curves its own kernels' ``compute``, ``compute_fp8``, ``compute_fp4`` and ``memory``
(``bench/data/loho_kernel_silicon.txt``); ``--without-kernel-silicon`` turns that off, so the two are compared on the
same cached fold fits (InferenceX TPOT 16.7% with it, 17.1% without; silicon 17.6% and 17.5%: 2026-11-27's curves).

    python bench/loho.py [--data FILE ...] [--jobs 2] [--systems b200-sxm,h100-sxm] [--engines] [--cache DIR]
                         [--without-kernel-silicon]

Prints, per file, the TPOT / TTFT (and output tokens/s per GPU where recorded) median and p90 APE of both, overall
and per held-out system, and the wall time; for a file that records tails (InferenceX: p99 TTFT, p99 TPOT, ITL),
their errors under the catalog's all-hardware transfer too, from the same folds. Under the all-hardware transfer it also counts the disaggregated rows predicted in a prefill-starved regime
(:func:`starved`) and the TPOT median without them. ``--engines``: leave one serving engine out instead (its rows predicted
with the factors fitted on the other engines' rows: each hardware's default block).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.calib import fit as F  # noqa: E402
from planner.calib.data import load_measured  # noqa: E402
from planner.calib.metrics import format_table, format_tail_table, summary_rows  # noqa: E402
from planner.calib.report import _predict_with, held_out, per_file_frames  # noqa: E402
from planner.catalog.loader import Catalog, load_catalog  # noqa: E402

SHARED = ROOT.parent / "shared" / "calibration"
DATA = [SHARED / "silicon_calibration.csv", SHARED / "inferencex" / "dsr1_runs.json"]


ARCHITECTURE = {"h100-sxm": "hopper", "h200-sxm": "hopper", "h800-sxm": "hopper", "b200-sxm": "blackwell",
                "gb200-nvl72": "blackwell", "b300-sxm": "blackwell", "gb300-nvl72": "blackwell", "mi300x": "cdna3",
                "mi325x": "cdna3", "mi355x": "cdna4"}


def sibling(catalog: Catalog, hid: str, measured) -> str | None:
    """The measured chip nearest ``hid``: of its architecture, else of its vendor, by datasheet distance."""
    import math

    hw = catalog.hardware[hid]
    cands = [catalog.hardware[m] for m in measured if m != hid]
    pool = ([c for c in cands if ARCHITECTURE.get(c.id) and ARCHITECTURE.get(c.id) == ARCHITECTURE.get(hid)]
            or [c for c in cands if c.vendor == hw.vendor])
    if not pool:
        return None

    def distance(c) -> float:
        return (abs(math.log(c.hbm_bandwidth_tb_s / hw.hbm_bandwidth_tb_s))
                + abs(math.log(c.flops("bf16") / hw.flops("bf16")))
                + abs(math.log(c.scale_up_domain_chips / hw.scale_up_domain_chips)))

    return min(pool, key=lambda c: (distance(c), c.id)).id


def _fold(args):
    norm, catalog, hw, cache = args
    path = cache / f"{hw}.pkl" if cache else None
    if path is not None and path.exists():
        # a fit cached before the first-wave delay existed gets it fitted on the fold's rows (idempotent)
        res = F.fit_first_wave(norm[norm["n_hw"] != hw], catalog, pickle.loads(path.read_bytes()))
    else:
        res = F.fit_norm(norm[norm["n_hw"] != hw], catalog)
        if path is not None:
            path.write_bytes(pickle.dumps(res))
    test = norm[norm["n_hw"] == hw]
    blocks = F.efficiency_blocks(res, catalog, "loho")
    allhw = _predict_with(blocks, catalog, test)
    rel = sibling(catalog, hw, list(res.by_hw))
    sib = _predict_with({**blocks, hw: blocks[rel]}, catalog, test) if rel else allhw
    hyb = _predict_with({**blocks, hw: hybrid(res, rel, blocks[hw])}, catalog, test) if rel else allhw
    return hw, test.index, sib, allhw, rel, hyb


def map_folds(fn, args: list, jobs: int) -> list:
    """``fn`` over each fold's ``args``, in ``jobs`` processes (in this one when 1)."""
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            return list(ex.map(fn, args))
    return [fn(x) for x in args]


def hybrid(res, rel: str, block):
    """The all-hardware block with the kernel and link factors (``HARDWARE_FACTORS``) of the sibling's own fit over
    all its engines: the chip family's silicon, the engines' software from every other chip (``group_prior``'s split)."""
    return block.model_copy(update={
        "default": F.group_prior(res.by_hw[rel], block.default),
        "by_engine": {e: F.group_prior(res.by_hw[rel], eff) for e, eff in block.by_engine.items()}})


def starved(norm: pd.DataFrame, pred: pd.DataFrame) -> str:
    """Disaggregated rows the held-out model puts in a prefill-starved regime (predicted TTFT over 3x the measured and
    TPOT over 20% fast: the transferred prefill rate is short of what the decode pool needs, so the model queues the
    clients in front of prefill and decodes a fraction of the batch), and the TPOT median APE without them."""
    n = norm.loc[pred.index]
    err = pred["predicted_tpot_ms"] / n["m_tpot"] - 1.0
    flip = (n["n_mode"] == "disagg") & (pred["predicted_ttft_ms"] / n["m_ttft"] > 3.0) & (err < -0.2)
    by_hw = ", ".join(f"{h} {c}" for h, c in n[flip].groupby("n_hw").size().items())
    return (f"prefill-starved disaggregated rows: {int(flip.sum())} of {int((n['n_mode'] == 'disagg').sum())} "
            f"({by_hw or 'none'}); TPOT median APE {100 * err.abs().median():.1f}% with them, "
            f"{100 * err[~flip].abs().median():.1f}% without")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", action="append", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--systems", default=None, help="held-out hardware ids, comma-separated (default: every one)")
    ap.add_argument("--engines", action="store_true", help="leave one engine out instead of one hardware")
    ap.add_argument("--cache", type=Path, default=None,
                    help="folder keeping each fold's fit (pickled; reused when present, so transfer rules are compared "
                         "without refitting)")
    ap.add_argument("--without-kernel-silicon", action="store_true",
                    help="held-out chips keep the all-hardware silicon factors instead of their own kernels'")
    a = ap.parse_args()
    if a.without_kernel_silicon:
        F.kernel_silicon = lambda eff, *_: eff
    cat = load_catalog()
    sets = [load_measured(p, cat, measured=True) for p in (a.data or DATA)]
    if a.engines:
        t0 = time.perf_counter()
        frames = held_out(sets, cat, "n_engine", jobs=a.jobs)
        print(f"leave one engine out in {time.perf_counter() - t0:.0f} s")
        for name, f in frames.items():
            print(f"\n## {name}, leave one engine out\n")
            print(format_table(summary_rows(f, None), []))
            print()
            print(format_table(summary_rows(f, ["engine"]), ["engine"]))
        return
    norm, _ = F.prepare(sets, cat)
    systems = a.systems.split(",") if a.systems else sorted(norm["n_hw"].unique())
    t0 = time.perf_counter()
    if a.cache:
        a.cache.mkdir(parents=True, exist_ok=True)
    results = map_folds(_fold, [(norm, cat, h, a.cache) for h in systems], a.jobs)
    print(f"{len(systems)} folds in {time.perf_counter() - t0:.0f} s")
    for hw, _, _, _, rel, _ in results:
        print(f"  {hw} held out: inherits from {rel or 'the all-hardware fit'}")
    for rule, k in (("sibling", 2), ("all-hardware", 3), ("hybrid: sibling's silicon, all-hardware engines", 5)):
        frames = per_file_frames(sets, norm, pd.concat([r[k].set_axis(r[1]) for r in results]))
        if k == 3:
            allhw = pd.concat([r[k].set_axis(r[1]) for r in results])
            for src in sorted(norm["src"].unique()):
                rows = allhw.loc[norm.index[norm["src"] == src].intersection(allhw.index)]
                if (norm.loc[rows.index, "n_mode"] == "disagg").any():
                    print(f"\n{src}, transfer {rule}: {starved(norm, rows)}")
        for name, f in frames.items():
            print(f"\n## {name}, leave one hardware out, transfer: {rule}\n")
            print(format_table(summary_rows(f, None), []))
            print()
            print(format_table(summary_rows(f, ["system"]), ["system"]))
            tails = format_tail_table(summary_rows(f, None), [])
            if tails and k == 3:
                # the catalog's rule: the held-out chip's p99 and ITL (issue 46's leave-one-hardware-out targets)
                print(f"\n### {name}, leave one hardware out, tails (transfer: {rule})\n")
                print(tails)
                print()
                print(format_tail_table(summary_rows(f, ["system"]), ["system"]))


if __name__ == "__main__":
    main()
