from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PLANNER_TEST_SHARED", ROOT.parent / "shared"))
"""The workplace's shared folder; ``PLANNER_TEST_SHARED=/nonexistent`` runs the suite as a user's clone would."""
DATA = ROOT / "tests" / "data"
_CAL = SHARED / "calibration" if (SHARED / "calibration" / "silicon_calibration.csv").is_file() else DATA / "calibration"
CALIB = _CAL / "silicon_calibration.csv"
"""The measured rows: ../shared's whole file where present, else the extract in tests/data (README there)."""
IX = _CAL / "inferencex" / "dsr1_runs.json"
HF_CONFIGS = DATA / "hf-configs"
"""Copies of shared/calibration/hf-configs (tests/data/README.md)."""
REFERENCE = DATA / "reference"


def load_bench(name: str):
    """``bench/NAME.py`` as a module (the benchmark scripts' functions, for the tests that check them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def engine_flags() -> dict:
    """shared/reference/engine-flags.json, from its copy in tests/data (the suite needs no ../shared)."""
    import gzip
    import json

    return json.loads(gzip.decompress((REFERENCE / "engine-flags.json.gz").read_bytes()))


def crd_schema(kind: str) -> dict:
    """``openAPIV3Schema`` of a CRD the export writes (``leaderworkerset``, ``disaggregatedset``, ...)."""
    import gzip
    import json

    return json.loads(gzip.decompress((REFERENCE / "k8s" / f"{kind}.schema.json.gz").read_bytes()))


@pytest.fixture(scope="session")
def catalog():
    from planner.catalog import load_catalog

    return load_catalog(ROOT / "catalogs")


@pytest.fixture(autouse=True)
def _analysis_in_process(monkeypatch):
    """Plans made by the suite answer their analysis in this process unless a test asks for ``jobs``: the default
    (several processes where the plan's solve is slow) would depend on the machine's speed, and tests that patch
    the planner's internals patch this process only. tests/test_analysis_workers.py asks for workers."""
    patch_pipeline(monkeypatch, "PARALLEL_MIN_SOLVE_S", float("inf"))
    patch_pipeline(monkeypatch, "PRESTART_MIN_WORKLOADS", float("inf"))
    patch_pipeline(monkeypatch, "CANDIDATE_WORKER_MIN_WORKLOADS", float("inf"))


PIPELINE_MODULES = ("planner.pipeline.plan", "planner.pipeline.periods", "planner.pipeline.diagnose",
                    "planner.analysis.context", "planner.analysis.questions", "planner.analysis.binding",
                    "planner.analysis.workers")
"""The modules of the planning pipeline and its analysis, which tests patch as one (a name patched where it is
defined and wherever it was imported)."""


class _Pipeline:
    """The pipeline's names as one namespace, for reading them (:func:`patch_pipeline` patches them)."""

    def __getattr__(self, name):
        import importlib

        for mod in PIPELINE_MODULES:
            m = importlib.import_module(mod)
            if hasattr(m, name):
                return getattr(m, name)
        raise AttributeError(name)


PIPELINE = _Pipeline()


def patch_pipeline(monkeypatch, name: str, value) -> None:
    """Set ``name`` to ``value`` in every pipeline module that has it (where it is defined and where it is imported),
    undone by ``monkeypatch`` after the test."""
    import importlib

    found = False
    for mod in PIPELINE_MODULES:
        m = importlib.import_module(mod)
        if hasattr(m, name):
            monkeypatch.setattr(m, name, value)
            found = True
    assert found, f"no pipeline module has {name}"


TWO_NODE_SOURCES = ("long-context", "three-models", "growth-year", "multi-workload")
"""Bundled plans :func:`two_node_plan` may start from, in order: the first with a vLLM pool on 8-GPU nodes without
expert or attention data parallelism (which one has one moves with the catalog's factors)."""


def two_node_plan(dest: Path, plan: str | None = None, nth: int = 0) -> Path:
    """A copy of bundled ``plan`` (default: the first of :data:`TWO_NODE_SOURCES` with such a vLLM pool)
    in ``dest`` whose first (``nth``: its ``nth``) such pool spans two nodes (TP8 PP2, 16 GPUs a replica, stages over
    scale-out): the multi-host shape a re-plan may or may not choose, for tests of what the export does with it."""
    import json
    import shutil

    def vllm_pool(doc):
        pools = [p for p in doc["pools"] if p["engine"] == "vllm" and p["hardware"] in ("h200-sxm", "b200-sxm")
                 and p["layout"]["ep"] == 1 and p["layout"]["attn_dp"] == 1]
        return pools[nth] if len(pools) > nth else None

    if plan is None:
        plan = next(n for n in TWO_NODE_SOURCES
                    if vllm_pool(json.loads((ROOT / "plans" / n / "plan.json").read_text())) is not None)
    shutil.copytree(ROOT / "plans" / plan, dest)
    doc = json.loads((dest / "plan.json").read_text())
    pool = vllm_pool(doc)
    assert pool is not None, f"plans/{plan} has no vLLM pool on H200 or B200"
    pool["layout"].update(tp=8, pp=2, notation="TP8 PP2")
    pool.update(chips_per_replica=16, scale_out=True)
    (dest / "plan.json").write_text(json.dumps(doc))
    return dest
