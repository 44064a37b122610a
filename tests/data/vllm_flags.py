"""vLLM's ``vllm serve`` flags read from its released wheel with ``ast`` (nothing imported or run).

vLLM builds its parser from config dataclasses (``vllm/engine/arg_utils.py``): ``EngineArgs.add_cli_args`` calls
``group.add_argument("--flag", "-alias", **NAME_kwargs["field"], ...)`` where ``NAME_kwargs = get_kwargs(SomeConfig)``,
and ``get_kwargs`` (``_compute_kwargs``) turns each field's type into argparse keywords:

- a dataclass type: one JSON value;
- ``bool | str | None``: an optional value (``nargs="?"``);
- ``bool``: ``argparse.BooleanOptionalAction`` (``--flag`` and ``--no-flag``, no value);
- ``Literal[...]``: ``choices`` -- unless ``str`` is also allowed, when the literals are only a ``metavar`` (kept here
  as ``known_values``: the engine checks them later, at start-up);
- ``list``/``set``/``tuple``: one or more values; anything else one value.

The frontend (``vllm/entrypoints/common/cli_args.py``) adds ``--`` + field name for every field of ``FrontendArgs`` and
its bases, and ``make_arg_parser`` a few flags by hand. vLLM's ``FlexibleArgumentParser`` also accepts the
underscore spelling of every flag.
"""

from __future__ import annotations

import ast
import zipfile

ARG_UTILS = "vllm/engine/arg_utils.py"
CLI_ARGS = "vllm/entrypoints/common/cli_args.py"
_BUILTIN = {"bool", "int", "float", "str", "dict", "list", "tuple", "set", "None", "Any", "bytes"}
_CONTAINERS = {"list", "List", "set", "Set", "tuple", "Tuple", "Sequence", "frozenset"}
_DICTS = {"dict", "Dict", "Mapping", "MutableMapping"}


class Sources:
    """The wheel's modules, parsed on demand: classes, type aliases and imported names per module."""

    def __init__(self, wheel: zipfile.ZipFile):
        self.z = wheel
        self.names = set(wheel.namelist())
        self._cache: dict[str, dict | None] = {}

    def module(self, mod: str) -> dict | None:
        if mod not in self._cache:
            path = next((p for p in (mod.replace(".", "/") + ".py", mod.replace(".", "/") + "/__init__.py")
                         if p in self.names), None)
            self._cache[mod] = None if path is None else self._index(mod, path)
        return self._cache[mod]

    def _index(self, mod: str, path: str) -> dict:
        tree = ast.parse(self.z.read(path).decode())
        out: dict = {"classes": {}, "aliases": {}, "imports": {}, "package": mod if path.endswith("__init__.py")
                     else mod.rpartition(".")[0]}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                out["classes"][node.name] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                out["aliases"][node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None \
                    and ast.unparse(node.annotation) in ("TypeAlias", "typing.TypeAlias"):
                out["aliases"][node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = out["package"].split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for a in node.names:
                    out["imports"][a.asname or a.name] = (base, a.name)
            elif isinstance(node, ast.If):  # TYPE_CHECKING blocks
                for sub in node.body:
                    if isinstance(sub, ast.ImportFrom) and sub.module:
                        for a in sub.names:
                            out["imports"].setdefault(a.asname or a.name, (sub.module, a.name))
        return out

    def resolve(self, mod: str, name: str, depth: int = 0) -> tuple[str, str, object] | None:
        """(module, kind, node) of ``name`` as seen from ``mod``: kind ``class`` or ``alias``."""
        m = self.module(mod)
        if m is None or depth > 6:
            return None
        if name in m["classes"]:
            return mod, "class", m["classes"][name]
        if name in m["aliases"]:
            return mod, "alias", m["aliases"][name]
        if name in m["imports"]:
            src, orig = m["imports"][name]
            return self.resolve(src, orig, depth + 1)
        return None

    def fields(self, mod: str, cls: ast.ClassDef, depth: int = 0) -> dict[str, tuple[str, ast.expr]]:
        """Annotated fields of a dataclass, bases first (ClassVar and private names left out): name -> (module,
        annotation)."""
        out: dict[str, tuple[str, ast.expr]] = {}
        for base in cls.bases:
            r = self.resolve(mod, ast.unparse(base)) if depth < 6 else None
            if r and r[1] == "class":
                out.update(self.fields(r[0], r[2], depth + 1))
        for st in cls.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not st.target.id.startswith("_"):
                if "ClassVar" in ast.unparse(st.annotation):
                    continue
                out[st.target.id] = (mod, st.annotation)
        return out


def _is_dataclass(cls: ast.ClassDef) -> bool:
    decos = {ast.unparse(d).split("(")[0].split(".")[-1] for d in cls.decorator_list}
    return bool(decos & {"config", "dataclass"}) or any(ast.unparse(b).endswith("BaseModel") for b in cls.bases)


def _is_dict_class(cls: ast.ClassDef) -> bool:
    return any(ast.unparse(b).split("[")[0] in _DICTS | {"TypedDict"} for b in cls.bases)


def hints(src: Sources, mod: str, node: ast.expr, depth: int = 0) -> list[tuple]:
    """The union members of an annotation: ("bool"|"int"|..., ) ("literal", values) ("dataclass", name)
    ("list", ) ("dict", ) ("other", name)."""
    if depth > 8:
        return [("other", ast.unparse(node))]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted forward reference
        try:
            return hints(src, mod, ast.parse(node.value, mode="eval").body, depth + 1)
        except SyntaxError:
            return [("other", node.value)]
    if isinstance(node, ast.Constant) and node.value is None:
        return [("None",)]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return hints(src, mod, node.left, depth + 1) + hints(src, mod, node.right, depth + 1)
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).split(".")[-1]
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head in ("Optional",):
            return hints(src, mod, elts[0], depth + 1) + [("None",)]
        if head == "Union":
            return [h for e in elts for h in hints(src, mod, e, depth + 1)]
        if head == "Annotated":
            return hints(src, mod, elts[0], depth + 1)
        if head == "Literal":
            return [("literal", [v for e in elts for v in _literal_values(src, mod, e, depth)])]
        if head in _CONTAINERS:
            return [("list",)]
        if head in _DICTS:
            return [("dict",)]
        return [("other", head)]
    name = ast.unparse(node)
    short = name.split(".")[-1]
    if short in _BUILTIN:
        return [(short,)] if short not in ("dict", "list", "tuple", "set") else \
            [("dict",)] if short == "dict" else [("list",)]
    r = src.resolve(mod, name)
    if r is None:
        return [("other", name)]
    rmod, kind, target = r
    if kind == "alias":
        return hints(src, rmod, target, depth + 1)
    if _is_dict_class(target):
        return [("dict",)]
    return [("dataclass", name)] if _is_dataclass(target) else [("other", name)]


def _literal_values(src: Sources, mod: str, node: ast.expr, depth: int) -> list:
    """One element of ``Literal[...]``: a constant, or a name bound to a constant or to another ``Literal``."""
    try:
        return [ast.literal_eval(node)]
    except ValueError:
        pass
    r = src.resolve(mod, ast.unparse(node))
    if r is not None and r[1] == "alias":
        inner = hints(src, r[0], r[2], depth + 1)
        if inner and inner[0][0] == "literal":
            return inner[0][1]
        try:
            return [ast.literal_eval(r[2])]
        except ValueError:
            pass
    return [ast.unparse(node)]


def kwargs_of(h: list[tuple]) -> dict:
    """The entry of one field, following ``_compute_kwargs``'s order of cases."""
    kinds = {x[0] for x in h}
    literal = next((x[1] for x in h if x[0] == "literal"), None)
    if "dataclass" in kinds:
        return {"type": "json", "takes_value": True}
    if kinds - {"None"} == {"bool", "str"}:
        return {"type": "str", "takes_value": "optional"}
    if "bool" in kinds:
        return {"type": "bool", "takes_value": False, "negatable": True}
    if literal is not None:
        key = "known_values" if "str" in kinds else "choices"
        return {"type": type(literal[0]).__name__, key: sorted(literal, key=str), "takes_value": True}
    if "list" in kinds:
        return {"type": "list", "takes_value": True, "nargs": "+"}
    for t in ("int", "float"):
        if t in kinds:
            return {"type": t, "takes_value": True}
    if "dict" in kinds:
        return {"type": "json", "takes_value": True}
    return {"type": "str", "takes_value": True}


def _config_kwargs(src: Sources, mod: str, call: ast.Call) -> dict[str, dict]:
    """``get_kwargs(Cls)`` statically: field -> entry."""
    r = src.resolve(mod, ast.unparse(call.args[0]))
    if r is None or r[1] != "class":
        return {}
    return {f: {**kwargs_of(hints(src, m, ann)), "field": f}
            for f, (m, ann) in src.fields(r[0], r[2]).items()}


def _explicit(call: ast.Call, entry: dict) -> dict:
    """Keywords written in the ``add_argument`` call override what the field's type gave."""
    out = dict(entry)
    for k in call.keywords:
        if k.arg is None:
            continue
        text = ast.unparse(k.value)
        if k.arg == "action":
            act = text.strip("'\"").split(".")[-1]
            out["takes_value"] = act not in ("store_true", "store_false", "BooleanOptionalAction") \
                and not act.endswith("StoreTrueAction")
            out["negatable"] = act == "BooleanOptionalAction"
            if "Deprecated" in act:
                out["deprecated"] = True
        elif k.arg == "choices":
            try:
                out["choices"] = list(ast.literal_eval(k.value))
                out.pop("known_values", None)
            except ValueError:
                out["choices_from"] = text
        elif k.arg == "deprecated" and text == "True":
            out["deprecated"] = True
        elif k.arg == "type":
            out["type"] = text if text in ("int", "float", "str") else out.get("type", "str")
        elif k.arg == "nargs":
            out["nargs"] = ast.literal_eval(k.value) if isinstance(k.value, ast.Constant) else text
    return out


def _add_calls(src: Sources, mod: str, func: ast.FunctionDef) -> dict[str, dict]:
    """Flags registered in one function: ``add_argument`` calls with their ``**kwargs`` resolved."""
    tables: dict[str, dict] = {}  # NAME_kwargs -> field -> entry, or NAME -> entry
    flags: dict[str, dict] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value
            if isinstance(v, ast.Call) and ast.unparse(v.func).endswith("get_kwargs"):
                tables[node.targets[0].id] = _config_kwargs(src, mod, v)
            elif isinstance(v, ast.Subscript) and isinstance(v.value, ast.Call) \
                    and ast.unparse(v.value.func).endswith("get_kwargs"):
                tables[node.targets[0].id] = _config_kwargs(src, mod, v.value).get(ast.literal_eval(v.slice), {})
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        longs = [n for n in names if n.startswith("--")]
        if not longs:
            continue
        entry: dict = {"type": "str", "takes_value": True}
        for k in node.keywords:
            if k.arg is None:  # **table["field"], **table, or **{**table["field"], "key": value}
                sources = [k.value]
                if isinstance(k.value, ast.Dict):  # the spreads inside a dict literal
                    sources = [x for x, key in zip(k.value.values, k.value.keys, strict=True) if key is None]
                for v in sources:
                    if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name):
                        entry = dict(tables.get(v.value.id, {}).get(ast.literal_eval(v.slice), entry))
                    elif isinstance(v, ast.Name) and isinstance(tables.get(v.id), dict) and "type" in tables[v.id]:
                        entry = dict(tables[v.id])
        entry = _explicit(node, entry)
        aliases = [n for n in names if n != longs[0]]
        if entry.get("negatable"):
            aliases.append("--no-" + longs[0][2:])
        flags[longs[0]] = {"aliases": aliases, "type": entry.get("type", "str"),
                           "choices": entry.get("choices"), "known_values": entry.get("known_values"),
                           "takes_value": entry.get("takes_value", True), "nargs": entry.get("nargs"),
                           "deprecated": bool(entry.get("deprecated")), "field": entry.get("field")}
    return flags


def _function(tree: ast.Module, cls: str | None, name: str) -> ast.FunctionDef | None:
    body = tree.body
    if cls is not None:
        c = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        body = c.body if c else []
    return next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def vllm_flags(wheel_path) -> dict[str, dict]:
    z = zipfile.ZipFile(wheel_path)
    src = Sources(z)
    flags: dict[str, dict] = {}
    arg_mod, cli_mod = "vllm.engine.arg_utils", "vllm.entrypoints.common.cli_args"
    arg_tree = ast.parse(z.read(ARG_UTILS).decode())
    for cls in ("EngineArgs", "AsyncEngineArgs"):
        f = _function(arg_tree, cls, "add_cli_args")
        if f is not None:
            flags.update(_add_calls(src, arg_mod, f))
    cli_tree = ast.parse(z.read(CLI_ARGS).decode())
    frontend = src.resolve(cli_mod, "FrontendArgs")
    for field, (m, ann) in src.fields(frontend[0], frontend[2]).items():
        entry = kwargs_of(hints(src, m, ann))
        flag = "--" + field.replace("_", "-")
        flags[flag] = {"aliases": ["--no-" + flag[2:]] if entry.get("negatable") else [], "type": entry["type"],
                       "choices": entry.get("choices"), "known_values": entry.get("known_values"),
                       "takes_value": entry["takes_value"], "nargs": entry.get("nargs"), "deprecated": False,
                       "field": field}
    f = _function(cli_tree, None, "make_arg_parser")
    if f is not None:
        flags.update(_add_calls(src, cli_mod, f))
    return dict(sorted(flags.items()))
