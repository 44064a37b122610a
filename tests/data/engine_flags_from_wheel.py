"""Read an engine's command-line flags from its released wheel, without installing it (issue 44, item 1).

    python tests/data/engine_flags_from_wheel.py sglang==0.5.23 [--wheel PATH] [--out FILE] [--compare]
    python tests/data/engine_flags_from_wheel.py vllm==0.33.0 --out catalogs/engines/releases/vllm-0.33.0.flags.json.gz
    python tests/data/engine_flags_from_wheel.py trtllm@00209af1 --out catalogs/engines/releases/trtllm-00209af1.flags.json.gz
    python tests/data/engine_flags_from_wheel.py sglang-router==0.3.2 --out catalogs/engines/releases/sglang-router-0.3.2.flags.json.gz

vLLM's reader is ``vllm_flags.py`` (its parser is built from config dataclasses). TensorRT-LLM has no release wheel
on PyPI (a stub pointing at NVIDIA's index): its table is converted from the carried reference, read from
``serve.py`` at the commit given.

Downloads the wheel with ``pip download NAME==VERSION --no-deps`` (or reads ``--wheel``) and parses its sources with
``ast``; nothing is imported or run. SGLang >= 0.5.22: its server flags are derived from annotated
record fields (``sglang/srt/arg_groups/fields/*.py``: ``name: A[type, "help" | Arg(...)] = default``; the rules of
``arg_groups/arg_utils.add_cli_args_from_dataclass``: ``--`` + the field name with ``-`` for ``_`` unless
``Arg.cli_name``, plus ``Arg.aliases``; ``Arg.no_cli`` skipped; ``Literal`` gives the choices, ``bool`` a
``store_true`` flag, ``List`` one or more values) plus the flags ``server_args.add_cli_args`` registers by hand
(dynamic choices, deprecated spellings, ``--config``).

Writes one entry per flag in ``engine-flags.json``'s shape (``aliases``, ``type``, ``default``, ``choices``,
``takes_value``, ``deprecated``) with the wheel's name and SHA-256 as the source. ``--compare`` prints how it differs
from the carried ``reference/engine-flags.json.gz`` (flags added, removed, deprecated, choices changed).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIELDS = "sglang/srt/arg_groups/fields/"
CHOICES = "sglang/srt/arg_groups/choices.py"
SERVER_ARGS = "sglang/srt/server_args.py"
STORE_TRUE_ACTIONS = {"store_true", "DeprecatedStoreTrueAction"}


def download(spec: str, folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", spec, "--no-deps", "-d", str(folder), "-q"], check=True)
    return next(folder.glob("*.whl"))


def _constants(tree: ast.Module) -> dict[str, object]:
    """Module-level names bound to literals (lists, tuples, sets of constants), for ``choices=NAME``."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            try:
                value = ast.literal_eval(node.value) if node.value is not None else None
            except (ValueError, SyntaxError, TypeError):
                continue
            for t in targets:
                if isinstance(t, ast.Name):
                    out[t.id] = list(value) if isinstance(value, (list, tuple, set, frozenset)) else value
    return out


def _type_of(node: ast.expr) -> tuple[str, list | None, bool]:
    """(type name, Literal choices, is a list) of an annotation's type part, Optional unwrapped."""
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value)
        if head in ("Optional",):
            return _type_of(node.slice)
        if head in ("Literal",):
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            vals = [ast.literal_eval(e) for e in elts]
            return (type(vals[0]).__name__ if vals else "str"), vals, False
        if head in ("List", "list"):
            return _type_of(node.slice)[0], None, True
        if head in ("Union",):
            elts = [e for e in node.slice.elts if ast.unparse(e) != "None"]
            return _type_of(elts[0]) if len(elts) == 1 else ("str", None, False)
    if isinstance(node, ast.BinOp):  # X | None
        parts = [p for p in (node.left, node.right) if ast.unparse(p) != "None"]
        return _type_of(parts[0]) if len(parts) == 1 else ("str", None, False)
    return ast.unparse(node), None, False


def _kw(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _value(node, consts):
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return consts.get(ast.unparse(node), ast.unparse(node))


def field_flags(src: str, consts: dict) -> dict[str, dict]:
    """Flags of one ``fields/*.py`` module."""
    out = {}
    for cls in (n for n in ast.parse(src).body if isinstance(n, ast.ClassDef)):
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            ann = st.annotation
            if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")):
                continue
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            tp, meta = parts[0], parts[1] if len(parts) > 1 else None
            arg = meta if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg" else None
            if arg is not None and _value(_kw(arg, "no_cli"), consts) is True:
                continue
            name = _value(_kw(arg, "cli_name"), consts) if arg is not None else None
            flag = name or "--" + st.target.id.replace("_", "-")
            type_name, literal, is_list = _type_of(tp)
            action = ast.unparse(_kw(arg, "action")) if arg is not None and _kw(arg, "action") is not None else None
            choices = _value(_kw(arg, "choices"), consts) if arg is not None else None
            takes = not (type_name == "bool" and action is None and not is_list) and action not in STORE_TRUE_ACTIONS
            if action is not None and action.strip("'\"") in STORE_TRUE_ACTIONS:
                takes = False
            out[flag] = {
                "aliases": list(_value(_kw(arg, "aliases"), consts) or []) if arg is not None else [],
                "type": type_name if not is_list else f"list[{type_name}]",
                "default": _value(st.value, consts) if st.value is not None else None,
                "choices": choices if isinstance(choices, list) else literal,
                "takes_value": takes,
                "deprecated": False,
                "field": st.target.id,
            }
    return out


def manual_flags(src: str, consts: dict) -> dict[str, dict]:
    """Flags ``server_args.add_cli_args`` registers with ``parser.add_argument`` (deprecated ones marked)."""
    out = {}
    for node in ast.walk(ast.parse(src)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        if not names:
            continue
        action = _kw(node, "action")
        act = ast.unparse(action).strip("'\"") if action is not None else None
        choices = _value(_kw(node, "choices"), consts)
        nargs = _value(_kw(node, "nargs"), consts)
        out[names[0]] = {"aliases": names[1:], "type": ast.unparse(_kw(node, "type")) if _kw(node, "type") else "str",
                         "default": None, "choices": choices if isinstance(choices, list) else None,
                         "takes_value": act not in STORE_TRUE_ACTIONS, "deprecated": bool(act and "Deprecated" in act)}
        if nargs is not None:
            out[names[0]]["nargs"] = nargs
    return out


def sglang_flags(wheel: Path) -> dict:
    z = zipfile.ZipFile(wheel)
    consts = _constants(ast.parse(z.read(CHOICES).decode()))
    flags: dict[str, dict] = {}
    for name in sorted(n for n in z.namelist() if n.startswith(FIELDS) and n.endswith(".py")):
        src = z.read(name).decode()
        flags.update(field_flags(src, {**consts, **_constants(ast.parse(src))}))
    flags.update(manual_flags(z.read(SERVER_ARGS).decode(), consts))
    return dict(sorted(flags.items()))


def compare(new: dict, engine: str) -> list[str]:
    """How ``new`` differs from the carried reference's table of ``engine``."""
    old = json.loads(gzip.decompress((HERE / "reference" / "engine-flags.json.gz").read_bytes()))[engine]["flags"]
    lines = [f"added: {len(set(new) - set(old))}; removed: {len(set(old) - set(new))}"]
    lines += [f"  removed {f}" for f in sorted(set(old) - set(new))]
    lines += [f"  deprecated {f}" for f, e in new.items() if e.get("deprecated")]
    for f in sorted(set(old) & set(new)):
        a, b = old[f].get("choices"), new[f].get("choices")
        if a and b and sorted(map(str, a)) != sorted(map(str, b)):
            lines.append(f"  choices of {f}: {sorted(map(str, a))} -> {sorted(map(str, b))}")
    return lines


def router_flags(wheel: Path) -> dict:
    """``sglang-router``'s flags (``sglang_router/router_args.py``: ``add_argument(f"--{prefix}name", ...)`` with the
    prefix empty, as ``launch_router`` registers them)."""
    src = zipfile.ZipFile(wheel).read("sglang_router/router_args.py").decode().replace('f"--{prefix}', '"--')
    return dict(sorted(manual_flags(src, _constants(ast.parse(src))).items()))


def trtllm_from_reference(commit: str) -> dict:
    """TensorRT-LLM's ``trtllm-serve`` flags as the project read them from its source (no release wheel of
    TensorRT-LLM is on PyPI: its 10 KB sdist points at NVIDIA's own index), in the same shape."""
    ref = json.loads(gzip.decompress((HERE / "reference" / "engine-flags.json.gz").read_bytes()))["trtllm"]
    if not ref["source"]["commit"].startswith(commit):
        raise SystemExit(f"trtllm@{commit}: the carried reference was read at {ref['source']['commit']}")
    flags = {}
    for name, e in ref["flags"].items():
        if not name.startswith("--"):
            continue
        flags[name] = {"aliases": list(e.get("aliases") or []), "type": e.get("type", "str"),
                       "choices": e.get("choices"), "takes_value": bool(e.get("takes_value", True)),
                       "deprecated": bool(e.get("deprecated", False))}
    return dict(sorted(flags.items()))


def trtllm_config_fields() -> dict[str, list[str]]:
    """The ``--config`` YAML fields read from ``llm_args.py`` (carried reference), per dotted section ("" for the top
    level). The reference says its TorchLlmArgs list is partial: a key missing here may still be valid, but every
    key the export writes must be one that was read. ``cache_transceiver_config``'s keys are engine-rules 3.2's."""
    spec = json.loads(gzip.decompress((HERE / "reference" / "engine-flags.json.gz").read_bytes()))["trtllm"][
        "extra_llm_api_options_yaml"]
    spec_keys = [k.split(" ")[0] for k in spec["speculative_config"]["common_keys"] + spec["speculative_config"]["MTP_keys"]]
    return {"": sorted(set(spec["BaseLlmArgs"]) | set(spec["TorchLlmArgs"])),
            "kv_cache_config": sorted(spec["KvCacheConfig"]), "moe_config": sorted(spec["MoeConfig"]),
            "moe_config.load_balancer": sorted(spec["MoeLoadBalancerConfig"]),
            "attention_dp_config": sorted(spec["AttentionDpConfig"]), "cuda_graph_config": sorted(spec["CudaGraphConfig"]),
            "scheduler_config": sorted(spec["SchedulerConfig"]),
            "speculative_config": sorted({"decoding_type", *spec_keys}),
            "cache_transceiver_config": ["backend", "kv_transfer_sender_future_timeout_ms", "kv_transfer_timeout_ms",
                                         "max_tokens_in_buffer", "transceiver_runtime"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", help="sglang==VERSION, vllm==VERSION, sglang-router==VERSION, or trtllm@COMMIT (from the "
                                "carried reference)")
    ap.add_argument("--wheel", type=Path)
    ap.add_argument("--out", type=Path, help="FILE.json or FILE.json.gz")
    ap.add_argument("--compare", action="store_true")
    a = ap.parse_args(argv)
    if a.spec.startswith("trtllm@"):
        commit = a.spec.partition("@")[2]
        flags = trtllm_from_reference(commit)
        doc = {"source": {"package": "tensorrt-llm", "version": f"source@{commit}",
                          "read": "NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py at that commit (click options), "
                                  "as carried in reference/engine-flags.json.gz"},
               "syntax": "click", "flag_count": len(flags), "flags": flags, "config_fields": trtllm_config_fields()}
        return _write(a, doc, "trtllm")
    name, _, version = a.spec.partition("==")
    if name not in ("sglang", "vllm", "sglang-router") or not version:
        print(f"{a.spec}: give sglang==VERSION, vllm==VERSION, sglang-router==VERSION or trtllm@COMMIT", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        wheel = a.wheel or download(a.spec, Path(tmp))
        if name == "sglang":
            flags, read = sglang_flags(wheel), "ast over sglang/srt/arg_groups/fields/*.py and server_args.add_cli_args"
        elif name == "sglang-router":
            flags, read = router_flags(wheel), "ast over sglang_router/router_args.py (RouterArgs.add_cli_args, no prefix)"
        else:
            sys.path.insert(0, str(HERE))
            from vllm_flags import vllm_flags  # this folder's module

            flags, read = vllm_flags(wheel), ("ast over vllm/engine/arg_utils.py (EngineArgs/AsyncEngineArgs.add_cli_args "
                                              "with get_kwargs of the config dataclasses) and "
                                              "vllm/entrypoints/common/cli_args.py (FrontendArgs, make_arg_parser)")
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    doc = {"source": {"package": name, "version": version, "wheel": wheel.name, "sha256": digest, "read": read},
           "syntax": "argparse" + ("-underscores" if name == "vllm" else ""), "flag_count": len(flags), "flags": flags}
    return _write(a, doc, name)


def _write(a, doc: dict, name: str) -> int:
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if a.out:
        data = gzip.compress(text.encode(), mtime=0) if a.out.name.endswith(".gz") else text.encode()
        a.out.write_bytes(data)
    print(f"{name} {doc['source']['version']}: {doc['flag_count']} flags")
    if a.compare:
        print("\n".join(compare(doc["flags"], name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
