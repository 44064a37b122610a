"""The export's commands against their engine release's flags and start-up rules (issue 44, item 1).

Every bundled plan's launches pass; each failure the issue lists (and the other rules the export touches) is a
negative test: a real generated command, changed the way the old export got it wrong, must be caught by the rule
that names the engine's own condition.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner.catalog.releases import RULES_FILE, flag_table, rules_for
from planner.errors import InputError
from planner.export import launch
from planner.export.bundle import export_plan, read_plan
from planner.export.checks import Command, RuleError, check_command, check_pair, evaluate, functions, parse
from planner.export.deploy import deployments
from planner.export.verify import Launch, command_of, verify
from tests.conftest import ROOT

PLANS = sorted(p.name for p in (ROOT / "plans").iterdir() if (p / "plan.json").is_file())


def _deps(catalog, name):
    return deployments(read_plan(ROOT / "plans" / name), catalog, ROOT / "plans" / name)


def _launches(catalog, name, own_only=True):
    out = []
    for d in _deps(catalog, name):
        for t in launch.TARGETS:
            if own_only and t != d.engine or not catalog.get_engine(t).runs_on(catalog.get_hardware(d.hardware)):
                continue
            out.append(Launch(d, t, launch.command(d, t), launch.trtllm_config(d) if t == "trtllm" else None))
    return out


def _found(catalog, item: Launch, *, argv=None, env=None, config=None, metrics=None, facts=None) -> set[str]:
    cmd = command_of(item, catalog)
    if argv is not None:
        cmd.argv = argv
    if env is not None:
        cmd.env = env
    if config is not None:
        cmd.config = config
    if metrics is not None:
        cmd.metrics = metrics
    if facts is not None:
        cmd.facts = {**cmd.facts, **facts}
    eng = catalog.get_engine(item.target)
    return {v.rule for v in check_command(cmd, flag_table(catalog, eng), rules_for(catalog, eng))}


def _drop(argv: list[str], flag: str, with_value: bool = True) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + argv[i + (2 if with_value else 1):]


@pytest.mark.parametrize("name", PLANS)
def test_bundled_plans_start_on_their_engine_release(catalog, name):
    """Zero findings over every bundled plan's own launches and prefill/decode pairings."""
    items = _launches(catalog, name)
    found = verify(items, catalog)
    assert not found, [v.line() for v in found]


def test_every_rule_is_well_formed(catalog):
    """Each rule of each release evaluates on an empty command and on a real one without a language error, and
    the rules touching the flags the export emits are counted (the figure the issue asks for)."""
    seen = {}
    for e in ("sglang", "vllm", "trtllm"):
        rules = rules_for(catalog, catalog.get_engine(e))
        assert rules
        blank = functions(Command(pool="p", engine=e, argv=[]))
        pair = {**functions(Command(pool="p", engine=e, argv=[]), "prefill_"),
                **functions(Command(pool="q", engine=e, argv=[]), "decode_"), "same_engine": True}
        for r in rules:
            names = dict(pair if r.scope == "pair" else blank)
            for k, expr in r.vars.items():
                names[k] = evaluate(expr, names)
            evaluate(r.when, names)
            evaluate(r.require, names)
            seen[r.id] = r
    assert len(seen) >= 50
    assert all(r.source and r.message for r in seen.values())


def test_rule_language_refuses_what_it_does_not_know():
    with pytest.raises(RuleError):
        evaluate("__import__('os')", {})
    with pytest.raises(RuleError):
        evaluate("flag.__class__", {"flag": lambda f: f})
    with pytest.raises(RuleError):
        evaluate("(lambda: 1)()", {})
    assert evaluate("x if a > 2 else y", {"a": 3, "x": 1, "y": 2}) == 1
    assert evaluate("first(None, 4) * 2 in (8,)", {}) is True


# --- the failures the issue lists --------------------------------------------------------------------------


def test_vllm_dbo_without_an_all_to_all_backend_is_caught(catalog):
    item = next(i for i in _launches(catalog, "deepseek-chat") if "--enable-dbo" in i.args)
    assert not _found(catalog, item)
    assert "vllm.dbo-needs-a2a-backend" in _found(catalog, item, argv=_drop(item.args, "--all2all-backend"))
    # the default backend is refused on CUDA, allowed on ROCm
    bad = item.args[:item.args.index("--all2all-backend") + 1] + ["allgather_reducescatter"] \
        + item.args[item.args.index("--all2all-backend") + 2:]
    assert "vllm.dbo-needs-a2a-backend" in _found(catalog, item, argv=bad)
    assert "vllm.dbo-needs-a2a-backend" not in _found(catalog, item, argv=bad, facts={"vendor": "amd"})


@pytest.mark.parametrize("target,flag,override,env", [
    ("sglang", "--context-length", "--json-model-override-args", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"),
    ("vllm", "--max-model-len", "--hf-overrides", "VLLM_ALLOW_LONG_MAX_MODEL_LEN")])
def test_qwen3_context_beyond_its_config_is_caught(catalog, target, flag, override, env):
    """Qwen3's config allows 40,960 positions: 131,072 without the override the export writes is refused, and a
    YaRN override alone does not raise the derived length (engine-rules 1.5, 2.3)."""
    d = next(x for x in _deps(catalog, "multi-workload") if x.native_context_tokens == 40960)
    d = dataclasses.replace(d, context_tokens=101000)
    item = Launch(d, target, launch.command(d, target))
    assert not _found(catalog, item)
    rule = f"{target}.context-within-derived-length"
    assert rule in _found(catalog, item, argv=_drop(item.args, override))
    rope_only = list(item.args)
    rope_only[rope_only.index(override) + 1] = json.dumps({"rope_scaling": d.rope_scaling})
    assert rule in _found(catalog, item, argv=rope_only)
    assert rule not in _found(catalog, item, argv=_drop(item.args, override), env={env: "1"})


@pytest.mark.parametrize("target", ["sglang", "vllm"])
def test_fp4_quantization_of_a_bf16_checkpoint_is_caught(catalog, target):
    """--quantization modelopt_fp4 with the BF16 checkpoint as MODEL_PATH: vLLM cannot find the quantisation
    config; SGLang quantises the MoE experts only."""
    d = next(x for x in _deps(catalog, "multi-workload"))
    d = dataclasses.replace(d, weights_dtype="bf16", weights_source="native", native_dtype="bf16")
    item = Launch(d, target, launch.command(d, target) + ["--quantization", "modelopt_fp4"])
    assert f"{target}.quantization-needs-checkpoint-config" in _found(catalog, item)
    # a published FP8 checkpoint named with another method is refused as a mismatch
    pub = dataclasses.replace(d, weights_dtype="fp8", weights_source="published")
    item = Launch(pub, target, launch.command(pub, target) + ["--quantization", "modelopt_fp4"])
    assert f"{target}.quantization-matches-checkpoint" in _found(catalog, item)


def test_vllm_online_fp8_uses_the_current_method_name(catalog):
    d = next(x for x in _deps(catalog, "multi-workload"))
    d = dataclasses.replace(d, weights_dtype="fp8", weights_source="on-load", native_dtype="bf16")
    args = launch.command(d, "vllm")
    assert args[args.index("--quantization") + 1] == "fp8_per_tensor"
    old = args[:args.index("--quantization") + 1] + ["fp8"] + args[args.index("--quantization") + 2:]
    assert "vllm.quantization-needs-checkpoint-config" in _found(catalog, Launch(d, "vllm", old))


def test_prefill_and_decode_on_different_engines_are_caught(catalog):
    """The old deepseek-skewed export paired TensorRT-LLM decode with SGLang prefill: no engine receives another
    engine's KV (engine-rules 4)."""
    deps = {d.role: d for d in _deps(catalog, "deepseek-sglang-pd")}
    p = Launch(deps["prefill"], "sglang", launch.command(deps["prefill"], "sglang"))
    trt_decode = dataclasses.replace(_deps(catalog, "deepseek-skewed")[0], role="decode", pool="dec", engine="trtllm",
                                     workload=deps["prefill"].workload)
    q = Launch(trt_decode, "trtllm", launch.command(trt_decode, "trtllm"), launch.trtllm_config(trt_decode))
    found = {v.rule for v in verify([p, q], catalog)}
    assert {"sglang.pd-same-engine", "trtllm.pd-same-engine"} <= found
    # and a same-engine pair with different transfer backends
    pc, qc = command_of(p, catalog), command_of(Launch(deps["decode"], "sglang",
                                                       launch.command(deps["decode"], "sglang")), catalog)
    qc.argv = [("mooncake" if a == "nixl" else a) for a in qc.argv]
    for c in (pc, qc):
        parse(c, flag_table(catalog, catalog.get_engine("sglang")))
    rules = {"sglang": rules_for(catalog, catalog.get_engine("sglang"))}
    assert "sglang.pd-same-transfer-backend" in {v.rule for v in check_pair(pc, qc, rules)}


def test_alerts_that_cannot_fire_are_caught(catalog):
    """vLLM 0.33 no longer exports time_per_output_token_seconds; SGLang exports nothing without --enable-metrics.
    The vLLM launch is deepseek-chat's first pool as vLLM would run it (the plan picks its engine by the catalog)."""
    v = next(i for i in _launches(catalog, "deepseek-chat", own_only=False) if i.target == "vllm")
    assert "vllm.metric-names" in _found(catalog, v, metrics=["vllm:time_per_output_token_seconds"])
    assert "vllm.metric-names" in _found(catalog, v, metrics=["vllm:gpu_cache_usage_perc"])
    s = next(i for i in _launches(catalog, "deepseek-sglang-pd"))
    assert "sglang.metrics-need-flag" in _found(catalog, s, argv=_drop(s.args, "--enable-metrics", False))


def test_deprecated_and_unknown_flags_are_caught(catalog):
    s = next(i for i in _launches(catalog, "deepseek-sglang-pd") if i.deployment.attn_dp > 1)
    i = s.args.index("--attn-dp-size")
    old = s.args[:i] + ["--dp-size", s.args[i + 1], "--enable-dp-attention"] + s.args[i + 2:]
    found = _found(catalog, s, argv=old)
    assert {"flags.deprecated", "sglang.attn-dp-width-as-planned"} <= found
    assert "flags.unknown" in _found(catalog, s, argv=s.args + ["--enable-deepep-moe"])


def test_sglang_layout_rules(catalog):
    s = next(i for i in _launches(catalog, "deepseek-sglang-pd") if i.deployment.attn_dp > 1 and i.deployment.ep > 1)
    a = list(s.args)
    a[a.index("--ep-size") + 1] = str(int(a[a.index("--tp-size") + 1]) // 2)  # deepep overwrites a narrower EP
    assert "sglang.a2a-ep-is-tp" in _found(catalog, s, argv=a)
    b = _drop(_drop(list(s.args), "--attn-dp-size"), "--moe-a2a-backend") + ["--enable-two-batch-overlap"]
    assert "sglang.tbo-without-a2a-needs-attn-dp" in _found(catalog, s, argv=b)
    c = list(s.args)
    c[c.index("--attn-dp-size") + 1] = "3"
    assert "sglang.tp-divisible-by-attn-dp" in _found(catalog, s, argv=c)


def test_trtllm_rules(catalog):
    items = _launches(catalog, "deepseek-skewed")
    pre = next(i for i in items if i.deployment.role == "prefill")
    cfg = dict(pre.config)
    assert cfg["disable_overlap_scheduler"] is True and not _found(catalog, pre)
    cfg.pop("disable_overlap_scheduler")
    assert "trtllm.context-no-overlap-scheduler" in _found(catalog, pre, config=cfg)
    assert "trtllm.server-role-needs-discovery" in _found(catalog, pre, argv=pre.args + ["--server_role", "CONTEXT"])
    # the --config YAML's fields are checked too (llm_args refuses extra fields)
    assert "flags.config-key" in _found(catalog, pre, config={**pre.config, "enable_attention_data_parallel": True})
    assert "flags.config-key" in _found(catalog, pre, config={**pre.config, "kv_cache_config": {"fraction": 0.9}})
    wide = next(i for i in items if i.config.get("enable_attention_dp"))
    assert "trtllm.attention-dp-width-is-tp" in _found(catalog, wide, facts={"attn_dp": 2})
    assert "trtllm.world-size" in _found(catalog, wide, facts={"gpus": wide.deployment.gpus * 2})
    # an aggregated attention-DP pool balances its prompts over the ranks, as the plan priced it
    # (features.attention_dp_prefill_balance); a disaggregated one has no prompts to balance
    from dataclasses import replace

    for i in items:
        if i.config.get("enable_attention_dp"):
            assert ("attention_dp_config" in i.config) == (i.deployment.role == "aggregated"), i.deployment.pool
    assert "attention_dp_config" not in launch.trtllm_config(replace(wide.deployment, role="decode"))
    agg = replace(wide.deployment, role="aggregated")
    cfg = launch.trtllm_config(agg)
    assert cfg["attention_dp_config"] == {"enable_balance": True}
    assert catalog.get_engine("trtllm").features.attention_dp_prefill_balance
    assert not _found(catalog, Launch(agg, "trtllm", launch.command(agg, "trtllm"), cfg))


def test_an_engine_release_without_rules_is_refused(catalog, tmp_path):
    """An export to a release whose start-up rules were never read: exit 1, nothing written."""
    import shutil

    from planner.catalog.loader import clear_cache, load_catalog

    (tmp_path / "engines" / "releases").mkdir(parents=True)
    text = (ROOT / "catalogs" / "engines" / "sglang.yaml").read_text().replace('version: "0.5.23"', 'version: "0.6.0"')
    (tmp_path / "engines" / "sglang.yaml").write_text(text)
    for f in (ROOT / "catalogs" / "engines" / "releases").iterdir():
        shutil.copy(f, tmp_path / "engines" / "releases" / f.name)
    assert (tmp_path / "engines" / "releases" / RULES_FILE).is_file()
    cat = load_catalog(tmp_path)
    try:
        with pytest.raises(InputError, match=r"release 0\.6\.0: no start-up rules"):
            export_plan(ROOT / "plans" / "deepseek-sglang-pd", ["sglang"], tmp_path / "out", cat)
        assert not (tmp_path / "out").exists()
    finally:
        clear_cache()


# --- item 4: the router each engine documents ---------------------------------------------------------------


def _pd_as(catalog, engine):
    deps = _deps(catalog, "deepseek-sglang-pd")
    img = catalog.get_engine(engine).release.image_for(deps[0].hardware, deps[0].vendor)
    return [dataclasses.replace(d, engine=engine, image=img) for d in deps]


def test_vllm_pd_router_is_the_documented_proxy_over_the_pool_services(catalog):
    from planner.export.routers import pd_router

    deps = _pd_as(catalog, "vllm")
    objs = pd_router("chat", deps, "p", "ns", {"vllm": "0.33.0"})
    dep = next(o for o in objs if o["kind"] == "Deployment")
    spec = dep["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    pre = [d for d in deps if d.role == "prefill"]
    dec = [d for d in deps if d.role == "decode"]
    hosts = args[args.index("--prefiller-hosts") + 1:args.index("--prefiller-ports")]
    assert hosts == [f"{d.name}.ns.svc.cluster.local" for d in pre]
    assert args[args.index("--decoder-hosts") + 1:args.index("--decoder-ports")] == \
        [f"{d.name}.ns.svc.cluster.local" for d in dec]
    assert len(args[args.index("--decoder-ports") + 1:]) == len(dec)
    assert "v0.33.0/tests/v1/kv_connector/nixl_integration/toy_proxy_server.py" in " ".join(
        spec["initContainers"][0]["command"])
    assert spec["containers"][0]["image"] == "vllm/vllm-openai:v0.33.0"
    # every vLLM PD pod tells its peers the pod's own address for the NIXL handshake
    from planner.export import k8s

    pod = k8s._pod(pre[0], "vllm", leader=True, multi=False, plan_name="p")
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_trtllm_pd_router_lists_each_pool_once(catalog):
    import yaml

    from planner.export.routers import pd_router, trtllm_disagg_config

    deps = _pd_as(catalog, "trtllm")
    cfg = trtllm_disagg_config(deps, "ns")
    for key, role in (("context_servers", "prefill"), ("generation_servers", "decode")):
        urls = cfg[key]["urls"]
        assert cfg[key]["num_instances"] == len(urls) == sum(d.role == role for d in deps)  # "should be equal"
        assert len(set(urls)) == len(urls)  # "Duplicated ... server config"
    objs = pd_router("chat", deps, "p", "ns")
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    assert yaml.safe_load(cm["data"]["disagg_config.yaml"]) == cfg
    dep = next(o for o in objs if o["kind"] == "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"][:2] == ["trtllm-serve", "disaggregated"]
    # a mixed-engine set gets no router (the plan never pairs engines; the checker refuses such a set)
    mixed = [dataclasses.replace(d, engine="sglang") if d.role == "prefill" else d for d in deps]
    assert pd_router("chat", mixed, "p", "ns") == []


def test_images_are_pinned_to_the_release(catalog, tmp_path):
    """Every image the bundled exports use carries the engine release's version; none says latest."""
    import yaml

    for name in ("deepseek-sglang-pd", "deepseek-skewed", "three-models", "llama-70b-chat"):
        dest = tmp_path / name
        export_plan(ROOT / "plans" / name, ["k8s"], dest, catalog)
        for f in (dest / "k8s").glob("*.yaml"):
            for o in (x for x in yaml.safe_load_all(f.read_text()) if x):
                for c in _containers(o):
                    eng = next(e for e in ("sglang", "vllm", "trtllm") if e in c["image"].replace("tensorrt-llm", "trtllm"))
                    version = catalog.get_engine(eng).release.version
                    assert c["image"].split(":")[-1].lstrip("v").startswith(version), c["image"]
                    assert not c["image"].endswith(":latest")


def _containers(o: dict) -> list[dict]:
    out = []

    def walk(x):
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("containers", "initContainers") and isinstance(v, list):
                    out.extend(c for c in v if "image" in c)
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(o)
    return out


@pytest.mark.parametrize("name", ["c0091", "c0435", "c0439", "c0448"])
def test_export_campaign_sample(name):
    """CI's sample of ``bench/export_campaign.py`` (the full run: 684 generated scenarios): TensorRT-LLM, SGLang
    and vLLM disaggregated, SGLang on AMD; each is planned, exported and checked (flags and rules of the release,
    bash syntax, every Kubernetes object against its schema, pairings, autoscaler targets) with no finding."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("export_campaign", ROOT / "bench" / "export_campaign.py")
    camp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(camp)
    sc = next(s for s in camp.scenarios(None) if s["name"] == name)
    r = camp.one(sc)
    assert r["planned"] and r["exported"], r
    assert r["violations"] == [], r["violations"]


def test_vllm_replica_over_hosts_starts_as_one_engine(catalog):
    """A vLLM replica whose TP x PP spans two hosts: --nnodes, --node-rank, --master-addr, and the second host runs
    headless (vLLM refuses a world larger than the node's GPUs without --nnodes); dropping them is caught."""
    import subprocess

    d = next(x for x in _deps(catalog, "llama-70b-day") if x.role == "aggregated")
    d = dataclasses.replace(d, engine="vllm", tp=16, gpus=16, gpus_per_host=8, attn_dp=1, ep=1)
    item = Launch(d, "vllm", launch.command(d, "vllm"))
    assert item.args[item.args.index("--nnodes") + 1] == "2" and not _found(catalog, item)
    assert "vllm.multi-node-needs-nnodes" in _found(catalog, item, argv=_drop(item.args, "--nnodes"))
    text = launch.script(d, "vllm", item.args, notes=[])
    assert '[ "$NODE_RANK" = "0" ] || WORKER_ARGS=(--headless)' in text and '"${WORKER_ARGS[@]}"' in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_sglang_eagle_without_a_draft_needs_mtp_modules(catalog):
    d = next(x for x in _deps(catalog, "deepseek-sglang-pd") if x.spec_tokens)
    item = Launch(d, "sglang", launch.command(d, "sglang"))
    assert d.mtp_layers > 0 and "sglang.spec-draft-is-the-model-mtp" not in _found(catalog, item)
    assert "sglang.spec-draft-is-the-model-mtp" in _found(catalog, item, facts={"mtp_layers": 0})


def test_vllm_eplb_platform_and_v2_runner(catalog):
    item = next(i for i in _launches(catalog, "deepseek-chat"))
    if "--enable-eplb" not in item.args:
        item = Launch(item.deployment, "vllm", item.args + ["--enable-expert-parallel", "--enable-eplb"])
    assert "vllm.eplb-platform" in _found(catalog, item, facts={"vendor": "google"})
    dbo = Launch(item.deployment, "vllm", item.args + ["--enable-dbo", "--all2all-backend", "deepep_low_latency",
                                                     "--pipeline-parallel-size", "2"])
    assert "vllm.dbo-with-v2-model-runner" in _found(catalog, dbo, env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert "vllm.dbo-with-v2-model-runner" not in _found(catalog, dbo)


def test_sglang_router_flags_are_sglang_routers(catalog):
    """The PD router's command line against sglang-router 0.3.2's own flags: the annotation it reads bootstrap
    ports from is fixed (``router_args.py``), so the old ``--bootstrap-port-annotation`` flag would not start."""
    from planner.export.routers import pd_router
    from planner.export.verify import router_findings

    deps = _deps(catalog, "deepseek-sglang-pd")
    objs = pd_router("chat", deps, "p", "ns")
    assert objs and router_findings(objs, "sglang", catalog, "chat") == []
    dep = next(o for o in objs if o["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["args"] += ["--bootstrap-port-annotation", "sglang.ai/bootstrap-port"]
    assert [v.rule for v in router_findings(objs, "sglang", catalog, "chat")] == ["flags.unknown"]


def test_a_broken_rules_file_is_one_line_naming_the_rule(catalog, tmp_path, capsys):
    """A rule whose expression does not parse, or names a function the language lacks: exit 1 naming the file and
    the rule, not a traceback."""
    import shutil

    from planner.catalog.loader import clear_cache, load_catalog
    from planner.cli import main as cli

    (tmp_path / "engines" / "releases").mkdir(parents=True)
    shutil.copy(ROOT / "catalogs" / "engines" / "sglang.yaml", tmp_path / "engines" / "sglang.yaml")
    for f in (ROOT / "catalogs" / "engines" / "releases").iterdir():
        shutil.copy(f, tmp_path / "engines" / "releases" / f.name)
    rules = tmp_path / "engines" / "releases" / RULES_FILE
    text = rules.read_text()
    try:
        rules.write_text(text.replace('require: "flag(\'--attn-dp-size\') >= 1"', 'require: "flag(\'--attn-dp-size\') >="'))
        clear_cache()
        with pytest.raises(InputError, match=r"rules\.yaml.*sglang\.attn-dp-positive"):
            export_plan(ROOT / "plans" / "deepseek-sglang-pd", ["sglang"], tmp_path / "out", load_catalog(tmp_path))
        rules.write_text(text.replace('require: "flag(\'--attn-dp-size\') >= 1"', 'require: "nope(1)"'))
        clear_cache()
        from planner.catalog import releases

        releases._rules_file.cache_clear()
        with pytest.raises(SystemExit) as exit_:
            cli(["--catalog", str(tmp_path), "export", str(ROOT / "plans" / "deepseek-sglang-pd"), "--target",
                 "sglang", "--out", str(tmp_path / "out2")])
        assert exit_.value.code == 1 and not (tmp_path / "out2").exists()
        err = capsys.readouterr().err
        assert "rules.yaml" in err and "sglang.attn-dp-positive" in err and "Traceback" not in err
    finally:
        clear_cache()
