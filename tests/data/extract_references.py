"""Regenerate the reference extracts under tests/data/ from ../shared (run from the repository root):

    python tests/data/extract_references.py [--shared ../shared]

- ``reference/engine-flags.json.gz``: ``shared/reference/engine-flags.json`` whole, gzipped.
- ``reference/k8s/KIND.schema.json.gz``: ``openAPIV3Schema`` of the ``v1`` version of each CRD the export
  validates against (LeaderWorkerSet, DisaggregatedSet, PrometheusRule, ServiceMonitor, PodMonitor, HTTPRoute v1), as compact
  JSON (keys sorted), gzipped.
- ``hf-configs/*.json``: the Hugging Face ``config.json`` snapshots, byte for byte.
- ``calibration/silicon_calibration.csv`` and ``calibration/inferencex/dsr1_runs.json``: a few hundred measured
  rows and runs (unchanged, in their files' order): the rows the tests take by position (the first 60, the first
  20 disaggregated, the first 60 of Llama 3.1 70B and of DeepSeek), a sample of every system x engine x mode
  (8%, at least two, seed 0), and the silicon rows that are also InferenceX runs of six configurations measured
  both with and without MTP, with those runs; plus the first six runs and 80 sampled (seed 0).

The tests read these files only, so they run the same with or without ../shared. ``MANIFEST.json`` records
each copy's SHA-256 and its source's (``tests/test_references.py`` checks the copies against it);
``--check`` re-derives every copy from ../shared and exits 1 where one is stale. Gzip output is deterministic
(mtime 0).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HERE = Path(__file__).resolve().parent
CRDS = {
    "leaderworkerset": "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "disaggregatedset": "disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
    "prometheusrule": "monitoring.coreos.com_prometheusrules.yaml",
    "servicemonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "podmonitor": "monitoring.coreos.com_podmonitors.yaml",
    "httproute": "gateway.networking.k8s.io_httproutes.yaml",
    "inferencepool": "inference.networking.k8s.io_inferencepools.yaml",
}
LICENCES = ("LICENSE-lws", "LICENSE-prometheus-operator", "LICENSE-gateway-api", "LICENSE-gateway-api-inference-extension")


def gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def crd_schema(path: Path) -> bytes:
    """The ``openAPIV3Schema`` of the CRD's ``v1`` version (its first where it has no ``v1``)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    versions = doc["spec"]["versions"]
    version = next((v for v in versions if v["name"] == "v1"), versions[0])
    schema = version["schema"]["openAPIV3Schema"]
    return json.dumps(schema, separators=(",", ":"), sort_keys=True).encode()


def calibration_extracts(shared: Path, out: Path) -> tuple[int, int]:
    """Write the measured-data extracts; return (silicon rows, InferenceX runs)."""
    import pandas as pd

    from planner.calib.data import load_measured
    from planner.calib.shared import shared_runs
    from planner.catalog import load_catalog

    cal = shared / "calibration"
    cat = load_catalog(HERE.parents[1] / "catalogs")
    df = pd.read_csv(cal / "silicon_calibration.csv", dtype=str, keep_default_na=False)
    keep = set(range(60)) | set(df.index[df["mode"] == "disagg"][:20])
    sil = load_measured(cal / "silicon_calibration.csv", cat, measured=True)
    for model in ("llama-3.1-70b", "deepseek-v3"):
        keep |= set(sil.norm.index[sil.norm["n_model"] == model][:60])
    groups = df.groupby(["system", "backend", "mode"], sort=True)
    for _, g in groups:
        keep |= set(g.sample(n=max(2, round(0.08 * len(g))), random_state=0).index)
    runs = json.loads((cal / "inferencex" / "dsr1_runs.json").read_text(encoding="utf-8"))
    ix = load_measured(cal / "inferencex" / "dsr1_runs.json", cat, measured=True)
    sh = shared_runs(sil, ix)
    key = ["system", "backend", "precision", "isl", "osl", "tp_size", "batch_size"]
    rows = df.loc[sh.index, key].assign(spec=sh["spec_method"].to_numpy())
    both = rows.groupby(key)["spec"].nunique()
    picked = set(both[both == 2].index[:6])
    pairs = rows[[tuple(r) in picked for r in rows[key].itertuples(index=False)]].index
    keep |= set(pairs)
    # the InferenceX runs those rows match (same keys as shared_runs)
    matched = _matching_runs(sil, ix, list(pairs))
    take = set(range(6)) | matched | set(pd.Series(range(len(runs))).sample(n=80, random_state=0))
    (out / "inferencex").mkdir(parents=True, exist_ok=True)
    df.loc[sorted(keep)].to_csv(out / "silicon_calibration.csv", index=False)
    (out / "inferencex" / "dsr1_runs.json").write_text(
        json.dumps([runs[i] for i in sorted(take)], indent=1) + "\n", encoding="utf-8")
    return len(keep), len(take)


def _matching_runs(sil, ix, rows: list) -> set[int]:
    """Positions of the InferenceX runs ``shared_runs`` pairs with the silicon ``rows``."""
    import dataclasses

    from planner.calib.shared import shared_runs

    sub = dataclasses.replace(sil, raw=sil.raw.loc[rows], norm=sil.norm.loc[rows])
    return {i for i in range(len(ix.raw))
            if len(shared_runs(sub, dataclasses.replace(ix, raw=ix.raw.iloc[[i]], norm=ix.norm.iloc[[i]])))}


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", type=Path, default=HERE.parents[1].parent / "shared")
    ap.add_argument("--check", action="store_true", help="compare the copies with ../shared; write nothing")
    a = ap.parse_args(argv)
    shared = a.shared
    sources: dict[str, Path] = {"reference/engine-flags.json.gz": shared / "reference" / "engine-flags.json"}
    made: dict[str, bytes] = {"reference/engine-flags.json.gz": gz(sources["reference/engine-flags.json.gz"].read_bytes())}
    for kind, name in CRDS.items():
        rel = f"reference/k8s/{kind}.schema.json.gz"
        sources[rel] = shared / "reference" / "k8s" / name
        made[rel] = gz(crd_schema(sources[rel]))
    for lic in LICENCES:
        sources[f"reference/k8s/{lic}"] = shared / "reference" / "k8s" / lic
    for f in sorted((shared / "calibration" / "hf-configs").glob("*.json")):
        sources[f"hf-configs/{f.name}"] = f
    for rel, src in sources.items():
        made.setdefault(rel, src.read_bytes())
    if a.check:
        stale = [rel for rel, data in made.items() if not (HERE / rel).is_file() or (HERE / rel).read_bytes() != data]
        print("stale: " + ", ".join(stale) if stale else f"{len(made)} copies match {shared}")
        return 1 if stale else 0
    for rel, data in made.items():
        (HERE / rel).parent.mkdir(parents=True, exist_ok=True)
        (HERE / rel).write_bytes(data)
    n_sil, n_ix = calibration_extracts(shared, HERE / "calibration")
    sources["calibration/silicon_calibration.csv"] = shared / "calibration" / "silicon_calibration.csv"
    sources["calibration/inferencex/dsr1_runs.json"] = shared / "calibration" / "inferencex" / "dsr1_runs.json"
    manifest = {rel: {"sha256": _sha((HERE / rel).read_bytes()), "source": str(src.relative_to(shared)),
                      "source_sha256": _sha(src.read_bytes())} for rel, src in sorted(sources.items())}
    (HERE / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(f"{len(manifest)} copies; calibration extracts: {n_sil} silicon rows, {n_ix} InferenceX runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
