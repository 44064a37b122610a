"""The reference copies in tests/data are what tests/data/extract_references.py made of ../shared: each copy
holds the bytes MANIFEST.json records for it (a copy edited by hand, or one the extractor no longer writes, fails
here), and holds what the tests read. ``python tests/data/extract_references.py --check`` compares them with
../shared itself where it is present."""

from __future__ import annotations

import hashlib
import importlib.util
import json

from tests.conftest import DATA, HF_CONFIGS, crd_schema, engine_flags


def _extractor():
    spec = importlib.util.spec_from_file_location("extract_references", DATA / "extract_references.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_extracts_hold_what_the_tests_read():
    flags = engine_flags()
    assert {"sglang", "vllm", "trtllm"} <= set(flags) and all(flags[e]["flags"] for e in ("sglang", "vllm", "trtllm"))
    mod = _extractor()
    for kind in mod.CRDS:
        schema = crd_schema(kind)
        assert schema["type"] == "object" and "spec" in schema["properties"], kind
    assert len(list(HF_CONFIGS.glob("*--*.json"))) >= 17


def test_copies_are_the_recorded_extracts():
    manifest = json.loads((DATA / "MANIFEST.json").read_text())
    mod = _extractor()
    expected = {"reference/engine-flags.json.gz", "calibration/silicon_calibration.csv",
                "calibration/inferencex/dsr1_runs.json"} | {f"reference/k8s/{k}.schema.json.gz" for k in mod.CRDS}
    assert expected <= set(manifest)
    for rel, entry in manifest.items():
        assert hashlib.sha256((DATA / rel).read_bytes()).hexdigest() == entry["sha256"], rel
        assert entry["source"] and len(entry["source_sha256"]) == 64
    copied = {p.relative_to(DATA).as_posix() for p in HF_CONFIGS.glob("*.json")}
    assert copied <= set(manifest)
