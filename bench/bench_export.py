"""Export speed (issue 44's target: the largest example plan in under 2 s).

    python bench/bench_export.py [--repeat 3]

Per bundled plan, the best of ``--repeat`` runs of ``export_plan`` to every target (launch scripts, expert maps,
Kubernetes manifests, runbook), in one process with the catalog loaded once; the ``planner export`` command adds
the interpreter's start and imports (about a second).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.catalog import load_catalog  # noqa: E402
from planner.export.bundle import export_plan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    cat = load_catalog()
    with tempfile.TemporaryDirectory() as tmp:
        for p in sorted((ROOT / "plans").iterdir()):
            if not (p / "plan.json").exists():
                continue
            best = float("inf")
            for k in range(a.repeat):
                t = time.perf_counter()
                doc = export_plan(p, ["sglang", "vllm", "trtllm", "k8s"], Path(tmp) / f"{p.name}-{k}", cat)
                best = min(best, time.perf_counter() - t)
            print(f"{p.name}: {best:.2f} s ({len(doc['files'])} files)")


if __name__ == "__main__":
    main()
