"""Property-based robustness suite (hypothesis, seeded): mutated scenarios, catalogs, measured data and
flags never crash the planner, and plans obey the metamorphic properties of cost minimisation.

Contract checked on every generated case: exit code in {0, 1, 2, 3}; no traceback and no "internal
error"; exit 0 only with a finite, positive-cost plan that passed its re-check. Metamorphic: more demand
is never cheaper, a looser SLO never dearer, more hardware never dearer, and the runner-up equals a
re-plan without the winner's hardware.

CI runs a few hundred cases (``PLANNER_PROPERTY_EXAMPLES``, default below, scales every test); run
``PLANNER_PROPERTY_EXAMPLES=2000 python -m pytest tests/test_properties.py`` for the long campaign.
The generator is derandomised (``PLANNER_PROPERTY_SEED`` picks another seed).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from planner.catalog.loader import clear_cache  # noqa: E402
from planner.cli import main  # noqa: E402
from tests.conftest import CALIB, ROOT  # noqa: E402

SCALE = int(os.environ.get("PLANNER_PROPERTY_EXAMPLES", "40"))
SEED = int(os.environ.get("PLANNER_PROPERTY_SEED", "20261122"))


def budget(share: float) -> settings:
    """Examples for one test: ``share`` of the scale (at least 5), derandomised, no deadline (solves vary)."""
    return settings(max_examples=max(5, int(SCALE * share)), deadline=None, derandomize=False, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


BASES = {
    "dense-agg": {
        "name": "dense", "model": "llama-3.1-70b", "weights": ["fp8"], "kv_cache": ["fp8"], "hardware": ["h100-sxm"],
        "serving": ["aggregated"],
        "workloads": [{"name": "chat", "requests_per_s": 20, "input_tokens": 1000, "output_tokens": 200,
                       "slo": {"ttft_ms": 2000, "tpot_ms": 50}}],
    },
    "dense-disagg-prefix": {
        "name": "prefix", "model": "llama-3.1-8b", "weights": ["bf16"], "kv_cache": ["bf16"],
        "hardware": ["h100-sxm", "mi300x"], "serving": ["aggregated", "disaggregated"], "utilisation_cap": 0.8,
        "workloads": [{"name": "rag", "requests_per_s": 30, "input_tokens": 4000, "output_tokens": 300,
                       "prefix_cache": {"hit_rate": 0.5, "working_set_gb": 500},
                       "slo": {"ttft_ms": 1500, "tpot_ms": 40}}],
    },
    "moe": {
        "name": "moe", "model": "qwen3-30b-a3b", "weights": ["fp8"], "kv_cache": ["fp8"], "hardware": ["h100-sxm"],
        "serving": ["aggregated"],
        "workloads": [{"name": "chat", "requests_per_s": 50, "input_tokens": 1000, "output_tokens": 300,
                       "slo": {"ttft_ms": 2000, "tpot_ms": 50}}],
    },
}

WEIRD = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**25),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 1e-300, 1e300, 1e20, 0.999999, 1.0, 2**31, 2**63, "", "x", "1e3", "inf", "nan"]),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-3, 3), max_size=3),
    st.lists(st.floats(0, 50), min_size=2, max_size=6),  # a traffic profile
    st.dictionaries(st.sampled_from(["a", "ttft_ms", "hit_rate"]), st.integers(-5, 5), max_size=2),
)

EXTRA_PATHS = [
    "utilisation_cap", "engine", "limits", "limits.max_units", "limits.power_kw", "limits.budget_usd_per_hour",
    "prices", "expert_load", "workloads.0.prefix_cache", "workloads.0.prefix_cache.working_set_gb",
    "workloads.0.prefix_cache.hit_rate", "workloads.0.slo.ttft_ms", "workloads.0.slo.tpot_ms", "workloads.1",
    "hardware.0", "weights.0", "kv_cache.0", "serving.0", "model",
    "resilience", "resilience.lose_units", "margin", "margin.quantile", "price_tiers",
    "price_tiers.h100-sxm.spot", "price_tiers.h100-sxm.spot.usd_per_chip_hour",
    "price_tiers.h100-sxm.spot.preemption_rate", "limits.max_hardware_types",
    "limits.max_pool_types_per_workload", "limits.pool_type_usd_per_hour", "workloads.0.profile",
]


def _leaves(doc, prefix=""):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, f"{prefix}{i}.")
    yield prefix.rstrip(".")


def _set(doc, path: str, value, delete: bool = False) -> None:
    keys = path.split(".")
    node = doc
    for k in keys[:-1]:
        if isinstance(node, list):
            i = int(k) if k.isdigit() else 0
            if i >= len(node):
                return
            node = node[i]
        elif isinstance(node, dict):
            node = node.setdefault(k, {})
            if not isinstance(node, (dict, list)):
                return
        else:
            return
    last = keys[-1]
    if isinstance(node, list):
        if not last.isdigit():
            return
        i = int(last)
        if delete and i < len(node):
            node.pop(i)
        elif i < len(node):
            node[i] = value
        else:
            node.append(value)
    elif isinstance(node, dict):
        if delete:
            node.pop(last, None)
        else:
            node[last] = value


@st.composite
def mutated_scenario(draw):
    base = draw(st.sampled_from(sorted(BASES)))
    doc = json.loads(json.dumps(BASES[base]))
    paths = sorted(set(_leaves(doc)) - {""}) + EXTRA_PATHS
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        if draw(st.integers(0, 5)) == 0:
            _set(doc, path, None, delete=True)
        else:
            _set(doc, path, draw(WEIRD))
    return doc


def run_cli(*args) -> tuple[int, str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def contract(code: int, err: str) -> None:
    assert code in (0, 1, 2, 3), (code, err)
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    if code:
        msgs = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert len(msgs) == 1, err


def _finite_json(text: str):
    def bad(c):
        raise AssertionError(f"non-finite number in JSON: {c}")

    return json.loads(text, parse_constant=bad)


def check_plan_folder(folder: Path) -> None:
    doc = _finite_json((folder / "plan.json").read_text())
    o = doc["objective"]["usd_per_hour"]
    assert math.isfinite(o) and o > 0, o
    assert doc["status"] in ("optimal", "feasible")
    assert doc["recheck"]["ok"], doc["recheck"]
    assert doc["pools"] and all(p["replicas"] >= 1 for p in doc["pools"])


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("props")


@seed(SEED)
@budget(2.0)
@given(doc=mutated_scenario())
def test_mutated_scenarios_keep_the_contract(work, doc):
    s = work / "s.yaml"
    s.write_text(yaml.safe_dump(doc, allow_unicode=True))
    out = work / "plan"
    shutil.rmtree(out, ignore_errors=True)
    code, _, err = run_cli("plan", s, "--out", out, "--no-analysis", "--time-limit", "10")
    contract(code, err)
    if code == 0:
        check_plan_folder(out)


@seed(SEED)
@budget(1.0)
@given(data=st.one_of(st.binary(max_size=400), st.text(max_size=400).map(lambda t: t.encode("utf-8", "replace"))))
def test_arbitrary_scenario_bytes(work, data):
    s = work / "raw.yaml"
    s.write_bytes(data)
    code, _, err = run_cli("plan", s, "--out", work / "rawplan", "--no-analysis", "--time-limit", "5")
    contract(code, err)
    assert code != 0, "arbitrary bytes must not plan"


@pytest.fixture(scope="module")
def calib_head():
    lines = CALIB.read_text(encoding="utf-8").splitlines()
    return lines[0], lines[1:8]


CELLS = st.sampled_from(["", "inf", "-inf", "nan", "-1", "0", "1e400", "abc", "2.5", "1e9", "65537", "agg", "disagg",
                         "fp8", "trtllm", "unknown"])


@seed(SEED)
@budget(1.0)
@given(edits=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 40), CELLS), min_size=1, max_size=6))
def test_mutated_measured_rows(work, calib_head, edits):
    import csv
    import io

    head, rows = calib_head
    names = next(csv.reader([head]))
    table = [next(csv.reader([r])) for r in rows]
    for r, c, v in edits:
        table[r][c % len(names)] = v
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(names)
    w.writerows(table)
    p = work / "rows.csv"
    p.write_text(buf.getvalue())
    code, out, err = run_cli("validate", "--data", p, "--json")
    contract(code, err)
    assert code in (0, 1)
    if code == 0:
        _finite_json(out)  # summaries may say null, never NaN literals
    pred = work / "pred.csv"
    code, _, err = run_cli("predict", "--data", p, "--out", pred, "--force")
    contract(code, err)


NUMS = st.one_of(st.sampled_from(["nan", "inf", "-inf", "0", "-3", "1e30", "abc", "1", "8", "64", "2048", "0.5"]),
                 st.integers(-10, 10**7).map(str))


@seed(SEED)
@budget(1.5)
@given(batch=NUMS, context=NUMS, tp=st.sampled_from(["1", "2", "8", "0", "-1", "3", "1024"]),
       ep=st.sampled_from(["1", "8", "0", "7"]), phase=st.sampled_from(["decode", "prefill", "other"]),
       model=st.sampled_from(["llama-3.1-70b", "deepseek-v3", "qwen3-30b-a3b", "nope"]),
       hw=st.sampled_from(["h100-sxm", "gb200-nvl72", "mi300x", "tpu-v6e", "nope"]))
def test_roofline_flags(batch, context, tp, ep, phase, model, hw):
    code, out, err = run_cli("roofline", "--model", model, "--hardware", hw, "--batch", batch, "--context", context,
                             "--tp", tp, "--ep", ep, "--phase", phase, "--json")
    contract(code, err)
    assert code in (0, 1)
    if code == 0:
        _finite_json(out)


HW_FIELDS = ["hbm_gb", "hbm_bandwidth_tb_s", "price_usd_per_chip_hour", "tdp_w", "scale_up_domain_chips",
             "bf16_tflops", "fp8_tflops"]


@seed(SEED)
@budget(0.75)
@given(field=st.sampled_from(HW_FIELDS), value=WEIRD)
def test_mutated_hardware_entries(work, field, value):
    cat = work / "cat"
    if not cat.exists():
        shutil.copytree(ROOT / "catalogs", cat)
    f = cat / "hardware" / "h100-sxm.yaml"
    original = (ROOT / "catalogs" / "hardware" / "h100-sxm.yaml").read_text()
    doc_lines = original.splitlines()
    rendered = yaml.safe_dump({field: value}, default_flow_style=True).strip()[1:-1]  # "field: value"
    lines = [rendered if ln.split(":")[0].strip() == field and not ln.startswith(" ") else ln for ln in doc_lines]
    f.write_text("\n".join(lines) + "\n")
    try:
        clear_cache()
        code, _, err = run_cli("--catalog", cat, "catalog", "validate")
        contract(code, err)
        code, out, err = run_cli("--catalog", cat, "roofline", "--model", "llama-3.1-70b", "--hardware", "h100-sxm",
                                 "--batch", "16", "--context", "2048", "--tp", "8", "--json")
        contract(code, err)
        if code == 0:
            _finite_json(out)
    finally:
        f.write_text(original)
        clear_cache()


# -- metamorphic properties (library level: the same pipeline, without the CLI) ---------------------------


def _plan_cost(doc: dict, analysis: bool = False):
    from planner.catalog import load_catalog
    from planner.catalog.scenario import Scenario, resolve_scenario
    from planner.errors import InfeasibleError
    from planner.options import PlanOptions
    from planner.pipeline.plan import make_plan

    cat = load_catalog(ROOT / "catalogs")
    rs = resolve_scenario(Scenario.model_validate(doc), cat, Path("generated.yaml"))
    try:
        plan = make_plan(rs, PlanOptions(analysis=analysis, time_limit_s=30, mip_gap=1e-6)).plan
    except InfeasibleError:
        return math.inf, None
    return plan.objective.usd_per_hour, plan


TOL = 1e-5


@seed(SEED)
@budget(0.5)
@given(d1=st.floats(1, 400), d2=st.floats(1, 400), base=st.sampled_from(["dense-agg", "moe"]))
def test_more_demand_is_never_cheaper(d1, d2, base):
    lo, hi = sorted((d1, d2))
    doc = json.loads(json.dumps(BASES[base]))
    doc["workloads"][0]["requests_per_s"] = lo
    c_lo, _ = _plan_cost(doc)
    doc["workloads"][0]["requests_per_s"] = hi
    c_hi, _ = _plan_cost(doc)
    assert c_lo <= c_hi * (1 + TOL), (lo, hi, c_lo, c_hi)


@seed(SEED)
@budget(0.5)
@given(t1=st.floats(15, 200), t2=st.floats(15, 200), which=st.sampled_from(["tpot_ms", "ttft_ms"]))
def test_looser_slo_is_never_dearer(t1, t2, which):
    tight, loose = sorted((t1, t2))
    if which == "ttft_ms":
        tight, loose = tight * 20, loose * 20
    doc = json.loads(json.dumps(BASES["dense-agg"]))
    doc["workloads"][0]["slo"][which] = tight
    c_tight, _ = _plan_cost(doc)
    doc["workloads"][0]["slo"][which] = loose
    c_loose, _ = _plan_cost(doc)
    assert c_loose <= c_tight * (1 + TOL), (tight, loose, c_tight, c_loose)


ALL_HW = ["h100-sxm", "h200-sxm", "b200-sxm", "mi300x", "mi355x"]


@seed(SEED)
@budget(0.4)
@given(subset=st.lists(st.sampled_from(ALL_HW), min_size=1, max_size=3, unique=True),
       extra=st.sampled_from(ALL_HW))
def test_more_hardware_is_never_dearer(subset, extra):
    doc = json.loads(json.dumps(BASES["dense-agg"]))
    doc["hardware"] = subset
    c_small, _ = _plan_cost(doc)
    doc["hardware"] = sorted({*subset, extra})
    c_big, _ = _plan_cost(doc)
    assert c_big <= c_small * (1 + TOL), (subset, extra, c_small, c_big)


@seed(SEED)
@budget(0.25)
@given(demand=st.floats(5, 300), subset=st.lists(st.sampled_from(ALL_HW), min_size=2, max_size=4, unique=True))
def test_runner_up_is_the_replan_without_the_winner(demand, subset):
    doc = json.loads(json.dumps(BASES["dense-agg"]))
    doc["hardware"] = subset
    doc["workloads"][0]["requests_per_s"] = demand
    cost, plan = _plan_cost(doc, analysis=True)
    if plan is None or plan.runner_up is None:
        return
    rest = [h for h in subset if h != plan.runner_up.excluded]
    doc["hardware"] = rest
    again, _ = _plan_cost(doc)
    if plan.runner_up.usd_per_hour is None:
        assert again == math.inf
    else:
        assert plan.runner_up.usd_per_hour == pytest.approx(again, rel=1e-3)


@pytest.fixture(scope="module")
def runs_head():
    path = CALIB.parent / "inferencex" / "dsr1_runs.json"
    return json.loads(path.read_text(encoding="utf-8"))[:6]


RUN_FIELDS = ["hardware", "framework", "model", "precision", "spec_method", "disagg", "is_multinode", "prefill_tp",
              "prefill_ep", "prefill_dp_attention", "prefill_num_workers", "decode_tp", "decode_ep", "decode_dp_attention",
              "decode_num_workers", "num_prefill_gpu", "num_decode_gpu", "isl", "osl", "conc", "metrics",
              "metrics.median_tpot", "metrics.median_ttft", "metrics.output_tput_per_gpu", "workers", "date"]


@seed(SEED)
@budget(1.0)
@given(edits=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(RUN_FIELDS), WEIRD, st.booleans()),
                      min_size=1, max_size=4))
def test_mutated_inferencex_runs(work, runs_head, edits):
    runs = json.loads(json.dumps(runs_head))
    for i, field, value, delete in edits:
        _set(runs[i], field, value, delete=delete)
    p = work / "runs.json"
    p.write_text(json.dumps(runs))
    code, out, err = run_cli("validate", "--data", p, "--format", "inferencex", "--json")
    contract(code, err)
    assert code in (0, 1)
    if code == 0:
        _finite_json(out)
    code, _, err = run_cli("predict", "--data", p, "--format", "inferencex", "--out", work / "runs.csv", "--force")
    contract(code, err)
