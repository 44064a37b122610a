"""The reference copies in tests/data are what tests/data/extract_references.py makes of ../shared: where
../shared is present they must match it byte for byte (a changed reference is re-extracted, not silently
stale); in a clone without it they must hold what the tests read."""

from __future__ import annotations

import gzip
import importlib.util

from tests.conftest import DATA, HF_CONFIGS, SHARED, crd_schema, engine_flags


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


def test_extracts_match_the_shared_references():
    ref = SHARED / "reference"
    if not ref.is_dir():  # a user's clone: nothing to compare with (the test above checks the copies)
        return
    mod = _extractor()
    assert gzip.decompress((DATA / "reference" / "engine-flags.json.gz").read_bytes()) == \
        (ref / "engine-flags.json").read_bytes()
    for kind, name in mod.CRDS.items():
        got = gzip.decompress((DATA / "reference" / "k8s" / f"{kind}.schema.json.gz").read_bytes())
        assert got == mod.crd_schema(ref / "k8s" / name), kind
    for f in sorted((SHARED / "calibration" / "hf-configs").glob("*.json")):
        assert (HF_CONFIGS / f.name).read_bytes() == f.read_bytes(), f.name
