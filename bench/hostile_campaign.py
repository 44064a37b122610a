"""Hostile-input campaign: generated strings in every field that can reach a shell, a path, YAML or Markdown.

    python bench/hostile_campaign.py [--per-family 2000] [--seed 7] [--json]

Four field families, each fed ``--per-family`` generated values (command substitution, quotes, newlines,
``..`` and absolute paths, globs, NUL, unicode, over-long strings, each mixed with a valid prefix so that the
value looks like an id):

- ``catalog``: a model's ``id``, ``name``, ``hf_ids`` entry; a hardware ``id`` and ``name``; an engine ``id``;
- ``scenario``: the scenario ``name``, a workload ``name``;
- ``plan``: plan.json's pool ``id``, ``workload``, ``model``, ``hardware``, ``engine``, ``map_file``;
- ``import``: the file name of a config ``planner models import`` reads (and ``--hf-id``).

Each value is first given to the input layer (the strict schema the field belongs to). A value it accepts
must then survive the second wall: it is put into a pool's deployment and every launch script (SGLang, vLLM,
TensorRT-LLM) and Kubernetes object is built. A script must parse (``bashlex``) into the same shape as the
script of a harmless value (same commands, same words, no command or process substitution of its own); every
YAML document must load back to the value; every output path must stay inside the output folder. Values the
schema refuses are also pushed through the second wall (bypassing validation), so the quoting is tested on
its own. Exit 1 on any injection or escape.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FRAGMENTS = [
    "$(touch /tmp/PWNED)", "`touch /tmp/PWNED`", '"; touch /tmp/PWNED; "', "'; touch /tmp/PWNED; '",
    "\ntouch /tmp/PWNED\n", "\r\n", "${IFS}", "$HOME", "${PATH}", "$((1+1))", "<(id)", ">(id)", "| id", "&& id",
    "; id", "& id", "> /tmp/x", "< /etc/passwd", "*", "?", "[a-z]", "~", "~root", "#", "!", "!!", "\\", "\\\n",
    "../", "../../etc", "/etc/passwd", "/abs/path", ".", "..", "./x", "\x00", "\t", " ", "{a,b}", "%s", "{{x}}",
    "{x}", "é", "名", "\u202e", "\ufeff", "- x", "--flag", "-rf", ": x", "key: value", "[x]", "&anchor", "*alias",
    "!!python/object:os.system", "---", "...", "'", '"', "$", "`", "(", ")", "{", "}", "=", ",", "/", "|", "<", ">",
]
PREFIXES = ["", "org/x", "x", "deepseek-v3", "chat", "h200-sxm", "pool-1", "Qwen/Qwen3-8B", "sglang", "a.b", "map.json"]


def hostile(rng: random.Random) -> str:
    """One generated value: a prefix that looks valid, one to three fragments, sometimes very long."""
    parts = [rng.choice(PREFIXES)] + [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.3:
        parts.insert(rng.randint(0, len(parts)), rng.choice(PREFIXES))
    v = "".join(parts)
    if rng.random() < 0.03:
        v = v * rng.randint(20, 200)
    return v


# ------------------------------------------------------------------------------------------------------
# The second wall: scripts, YAML, paths built from a deployment that holds the value
# ------------------------------------------------------------------------------------------------------


def shape(node) -> tuple:
    """The structure of a bashlex tree without its literal text: which commands, how many words, and every
    expansion (parameter, command or process substitution) with its position."""
    kind = node.kind
    if kind == "word":
        return ("word", tuple(shape(p) for p in getattr(node, "parts", [])))
    if kind in ("parameter", "tilde"):
        return (kind, getattr(node, "value", ""))
    kids = []
    for attr in ("parts", "list"):
        for child in getattr(node, attr, None) or []:
            kids.append(shape(child))
    for attr in ("command", "output"):
        child = getattr(node, attr, None)
        if child is not None and hasattr(child, "kind"):
            kids.append(shape(child))
    return (kind, tuple(kids))


def script_shape(text: str) -> tuple:
    import bashlex

    return tuple(shape(n) for n in bashlex.parse(text))


def base_deployments():
    from planner.catalog import load_catalog
    from planner.export.bundle import read_plan
    from planner.export.deploy import deployments

    cat = load_catalog(ROOT / "catalogs")
    deps = []
    for name in ("deepseek-skewed", "llama-70b-chat"):
        plan_dir = ROOT / "plans" / name
        deps += deployments(read_plan(plan_dir), cat, plan_dir)
    return cat, deps


class Wall:
    """Builds every export artefact of a deployment with one string field replaced, and checks it."""

    FIELDS = ("pool", "workload", "hardware", "model_id", "model_path")

    def __init__(self, catalog, deps):
        from planner.export import launch

        self.catalog, self.launch = catalog, launch
        # deployments the export can launch (an engine with a pinned image; an ATOM pool is skipped by the export)
        ok = [d for d in deps if d.image]
        self.deps = [d for d in ok if d.multi_host][:1] + [d for d in ok if not d.multi_host][:1]
        # keyed by position: two plans' deployments can share a pool name (chat-decode-1)
        self.base: dict = {}
        for i, d in enumerate(self.deps):
            for t in launch.TARGETS:
                self.base[(i, t)] = script_shape(self._script(d, t))

    def _script(self, d, t: str) -> str:
        args = self.launch.command(d, t, expert_location="${PLANNER_DIR}/expert-location-sglang.json")
        return self.launch.script(d, t, args, notes=[f"note about {d.workload} and {d.model_path}"])

    def check(self, field: str, value: str, out: Path) -> list[str]:
        """Failures (empty: the value stayed data everywhere)."""
        from planner.errors import InputError
        from planner.export import k8s
        from planner.export.files import inside

        bad: list[str] = []
        for i, d0 in enumerate(self.deps):
            d = dataclasses.replace(d0, **{field: value})
            for t in self.launch.TARGETS:
                text = self._script(d, t)
                try:
                    got = script_shape(text)
                except Exception as exc:  # noqa: BLE001 - any parse failure is a finding
                    bad.append(f"{field}={value!r}: {t} script does not parse ({type(exc).__name__})")
                    continue
                if got != self.base[(i, t)]:
                    bad.append(f"{field}={value!r}: {t} script changed shape (extra command or expansion)")
            objs = [k8s.configmap(d, {"launch.sh": value}, "default")]
            objs += k8s.workload_objects([d], {d.pool: "sglang"}, "plan", "default")
            text = yaml.safe_dump_all(objs, sort_keys=False)
            back = list(yaml.safe_load_all(text))
            if back != objs:
                bad.append(f"{field}={value!r}: YAML does not load back to what was written")
            if field == "pool":
                try:
                    p = inside(out, f"{value}/launch-vllm.sh")
                except InputError:
                    continue
                if out.resolve() not in p.resolve().parents:
                    bad.append(f"{field}={value!r}: path {p} escapes {out}")
        return bad


# ------------------------------------------------------------------------------------------------------
# The first wall: the schema of each family
# ------------------------------------------------------------------------------------------------------


def _catalog_docs(cat) -> dict:
    m = cat.get_model("llama-3.1-70b").model_dump(mode="json", exclude_none=True)
    h = cat.get_hardware("h200-sxm").model_dump(mode="json", exclude_none=True)
    e = cat.get_engine("vllm").model_dump(mode="json", exclude_none=True)
    return {"model": m, "hardware": h, "engine": e}


def accepts(family: str, field: str, value: str, ctx: dict) -> bool:
    """Whether the input layer takes ``value`` for ``field`` (True: it must then be harmless)."""
    from pydantic import ValidationError

    from planner.catalog.scenario import Scenario
    from planner.catalog.schemas import EngineSpec, HardwareSpec, ModelSpec
    from planner.errors import InputError
    from planner.results import Plan

    try:
        if family == "catalog":
            kind, key = field.split(".")
            doc = json.loads(json.dumps(ctx["catalog"][kind]))
            if key == "hf_ids":
                doc["hf_ids"] = [value]
            else:
                doc[key] = value
            {"model": ModelSpec, "hardware": HardwareSpec, "engine": EngineSpec}[kind].model_validate(doc)
        elif family == "scenario":
            doc = json.loads(json.dumps(ctx["scenario"]))
            if field == "name":
                doc["name"] = value
            else:
                doc["workloads"][0]["name"] = value
            Scenario.model_validate(doc)
        elif family == "plan":
            doc = json.loads(json.dumps(ctx["plan"]))
            pool = doc["pools"][0]
            if field == "map_file":
                pool.setdefault("expert_placement", None)
                if pool["expert_placement"] is None:
                    return False
                pool["expert_placement"]["map_file"] = value
            else:
                pool[field] = value
            Plan.model_validate_json(json.dumps(doc))
        elif family == "import":
            from planner.catalog.hf_import import import_config

            folder: Path = ctx["tmp"]
            if field == "file_name":
                name = value + "--m.json" if "--" not in value else value + ".json"
                try:
                    path = folder / name
                    path.write_text(json.dumps(ctx["config"]))
                except (OSError, ValueError):
                    return False  # the file system itself refuses the name: nothing to import
                try:
                    import_config(path, model_id="imported")
                finally:
                    path.unlink(missing_ok=True)
            else:
                path = folder / "cfg.json"
                path.write_text(json.dumps(ctx["config"]))
                import_config(path, model_id="imported", hf_id=value)
        return True
    except (ValidationError, InputError):
        return False


FAMILIES = {
    "catalog": ["model.id", "model.name", "model.hf_ids", "hardware.id", "hardware.name", "engine.id"],
    "scenario": ["name", "workload"],
    "plan": ["id", "workload", "model", "hardware", "engine", "map_file"],
    "import": ["file_name", "hf_id"],
}
WALL_FIELD = {"model.id": "model_id", "model.hf_ids": "model_path", "hardware.id": "hardware", "name": "workload",
              "workload": "workload", "id": "pool", "model": "model_id", "hardware": "hardware",
              "file_name": "model_path", "hf_id": "model_path", "model.name": "workload",
              "hardware.name": "workload", "engine.id": "hardware", "engine": "hardware", "map_file": "pool"}
"""The deployment field a value of each input field reaches (or the nearest one that reaches the same places)."""

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 4096,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
          "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "head_dim": 128}


def run(per_family: int, seed: int, tmp: Path) -> dict:
    cat, deps = base_deployments()
    wall = Wall(cat, deps)
    plan_doc = json.loads((ROOT / "plans" / "deepseek-skewed" / "plan.json").read_text())
    from planner.catalog.inputs import load_yaml

    ctx = {"catalog": _catalog_docs(cat), "scenario": load_yaml(ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"),
           "plan": plan_doc, "config": CONFIG, "tmp": tmp}
    rng = random.Random(seed)
    report: dict = {"seed": seed, "per_family": per_family, "families": {}, "failures": []}
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    for family, fields in FAMILIES.items():
        counts = {"values": 0, "accepted": 0, "refused": 0, "wall_checks": 0}
        for i in range(per_family):
            field = fields[i % len(fields)]
            value = hostile(rng)
            ok = accepts(family, field, value, ctx)
            counts["values"] += 1
            counts["accepted" if ok else "refused"] += 1
            entered = value
            if family == "import" and field == "file_name":  # the id the importer read from the name
                from planner.catalog.hf_import import hf_id_from_path

                entered = hf_id_from_path(Path(value + ("--m.json" if "--" not in value else ".json")))
            if ok and not _harmless(entered):
                report["failures"].append(f"{family}.{field}: schema accepted {entered!r} (from {value!r})")
            if "\x00" not in value:
                report["failures"] += [f"{family}.{field}: {b}" for b in wall.check(WALL_FIELD[field], value, out)]
                counts["wall_checks"] += 1
        report["families"][family] = counts
    return report


def _harmless(value: str) -> bool:
    """What an accepted value may hold: an id (one slash at most) or a display name of the label alphabet."""
    import re

    from planner.catalog.ids import LABEL

    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?", value) is not None \
        or re.fullmatch(LABEL, value) is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import tempfile

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        rep = run(a.per_family, a.seed, Path(tmp))
    rep["wall_s"] = round(time.perf_counter() - t0, 1)
    if a.json:
        print(json.dumps(rep, indent=1))
    else:
        print(f"hostile campaign: seed {rep['seed']}, {rep['per_family']} values per family, {rep['wall_s']} s")
        for fam, c in rep["families"].items():
            print(f"  {fam:9s} {c['values']:6d} values: {c['accepted']:5d} accepted by the schema, {c['refused']:5d} "
                  f"refused; {c['wall_checks']} pushed through the scripts, YAML and paths")
        print(f"  injections or escapes: {len(rep['failures'])}")
        for f in rep["failures"][:20]:
            print("   ", f)
    return 1 if rep["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
