"""Scenario files (groundwork of the plan issue): bundled ones resolve; bad ones name file and field."""

from __future__ import annotations

import pytest
import yaml

from planner.catalog.scenario import load_scenario, resolve_scenario
from planner.errors import InputError
from tests.conftest import ROOT

SCEN = ROOT / "catalogs" / "scenarios"


@pytest.mark.parametrize("name", ["deepseek-chat", "llama-70b-chat", "long-context", "multi-workload"])
def test_bundled_scenarios_resolve(catalog, name):
    path = SCEN / f"{name}.yaml"
    r = resolve_scenario(load_scenario(path), catalog, path)
    assert r.scenario.name == name
    assert all(p > 0 for p in r.prices.values())


def test_long_context_and_multi_workload_shapes(catalog):
    long = load_scenario(SCEN / "long-context.yaml")
    assert max(w.input_tokens for w in long.workloads) >= 100_000
    multi = load_scenario(SCEN / "multi-workload.yaml")
    assert len(multi.workloads) >= 3


def test_price_override_and_default_hardware(catalog):
    r = resolve_scenario(load_scenario(SCEN / "deepseek-chat.yaml"), catalog)
    assert r.prices["gb200-nvl72"] == 3.30
    assert "tpu-v6e" not in r.prices  # no catalog price and no override


def _write(tmp_path, mutate):
    data = yaml.safe_load((SCEN / "deepseek-chat.yaml").read_text())
    mutate(data)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize(
    "mutate,pattern",
    [
        (lambda d: d["workloads"][0].__setitem__("requests_per_s", -5), r"s\.yaml: field 'workloads\.0\.requests_per_s'"),
        (lambda d: d.__setitem__("colour", "red"), r"field 'colour': unknown field"),
        (lambda d: d.__setitem__("model", "deepseek-v9"), r"field 'model': unknown model id"),
        (lambda d: d.__setitem__("hardware", ["h100-sxm", "h900"]), r"field 'hardware\.1': unknown hardware id"),
        (lambda d: d.__setitem__("hardware", ["tpu-v6e"]), r"field 'prices\.tpu-v6e': .*no catalog price"),
        (lambda d: d["limits"]["max_units"].__setitem__("gb400", 3), r"field 'limits\.max_units\.gb400'"),
        (lambda d: d.__setitem__("kv_cache", []), r"field 'kv_cache'"),
        (lambda d: d.__setitem__("weights", []), r"field 'weights'"),
    ],
)
def test_bad_scenarios(catalog, tmp_path, mutate, pattern):
    p = _write(tmp_path, mutate)
    with pytest.raises(InputError, match=pattern) as exc:
        resolve_scenario(load_scenario(p), catalog, p)
    assert "\n" not in str(exc.value)
