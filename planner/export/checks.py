"""Check exported launch commands against the target release of their engine: its flags and its start-up rules.

Two kinds of finding, each a :class:`Violation` naming the pool, the rule and its source:

- **flags** (``flags.*``): an option the release does not have, a value missing or given to a switch, a value
  outside the flag's choices (or the values the engine accepts at start-up), a deprecated spelling;
- **rules** (``catalogs/engines/releases/rules.yaml``): cross-flag conditions as data. ``when`` and ``require``
  are expressions in a small language evaluated here (constants, ``and``/``or``/``not``, comparisons, ``in``,
  arithmetic, ``x if c else y``, ``.get``) over functions of the command and the pool:

  ``has(F)``, ``flag(F, default)`` (a number where the value is one), ``json(F, 'a.b', default)`` (a key of a
  flag's JSON value), ``config('a.b', default)`` (TensorRT-LLM's ``--config`` YAML), ``env(NAME, default)``,
  ``fact(NAME, default)`` (the pool: ``vendor``, ``role``, ``gpus``, ``hosts``, ``attn_dp``, ``ep``,
  ``max_position_embeddings``, ``rope_scaling``, ``checkpoint_quant``), ``first(...)`` (the first not None),
  ``metrics()`` (the metric names read for the pool); for ``pair`` rules the same with ``prefill_``/``decode_``.
"""

from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass, field

from planner.catalog.releases import FlagTable, Rule
from planner.errors import InputError

_MISSING = object()


@dataclass(frozen=True)
class Violation:
    pool: str
    rule: str
    message: str
    source: str
    engine: str = ""
    """The engine of the command the finding is about ("" for a prefill/decode pairing)."""

    def line(self) -> str:
        return f"pool '{self.pool}': {self.rule}: {self.message} ({self.source})"


@dataclass
class Command:
    """One pool's launch command as the checker sees it."""

    pool: str
    engine: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)
    values: dict[str, object] = field(default_factory=dict)
    """Flag (canonical name) -> its value (True for a switch, a list for a repeated or multi-value flag)."""


def _number(v):
    if isinstance(v, str):
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
    return v


def parse(cmd: Command, table: FlagTable) -> list[Violation]:
    """Fill ``cmd.values`` from ``cmd.argv``; findings for options and values the release does not accept."""
    out: list[Violation] = []
    src = f"{table.engine} {table.version} flag table"

    def bad(rule: str, msg: str) -> None:
        out.append(Violation(cmd.pool, rule, msg, src, cmd.engine))

    args = cmd.argv
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-") or a in ("-m",):
            i += 2 if a == "-m" else 1
            continue
        key = table.canonical(a)
        if key is None:
            bad("flags.unknown", f"'{a}' is not a flag of {table.engine} {table.version}")
            i += 1
            continue
        entry = table.flags[key]
        if entry.get("deprecated"):
            bad("flags.deprecated", f"'{a}' is deprecated in {table.engine} {table.version}")
        negated = a.startswith("--no-") and not key.startswith("--no-")
        takes = entry.get("takes_value", True)
        if takes is False or negated:  # a switch: what follows is the next option or a positional argument
            cmd.values[key] = not negated
            i += 1
            continue
        vals = []
        j = i + 1
        many = entry.get("nargs") in ("+", "*") or str(entry.get("type", "")).startswith("list")
        while j < len(args) and not (args[j].startswith("--") or (args[j].startswith("-") and len(args[j]) == 2)):
            vals.append(args[j])
            j += 1
            if not many:
                break
        if not vals and takes != "optional":
            bad("flags.missing-value", f"'{a}' needs a value")
        allowed = entry.get("choices") or entry.get("known_values")
        for v in vals:
            if allowed and v not in [str(c) for c in allowed] and not v.startswith("${"):
                what = "choices" if entry.get("choices") else "values the engine accepts at start-up"
                bad("flags.choice", f"'{a} {v}' is not among the {what}: {', '.join(map(str, allowed))[:200]}")
        cmd.values[key] = ([_number(v) for v in vals] if many else _number(vals[0])) if vals else True
        i = j
    if table.config_fields is not None:
        _config_keys(cmd.config, "", table.config_fields, bad)
    return out


def _config_keys(doc: dict, section: str, fields: dict[str, list[str]], bad) -> None:
    """Every key of a ``--config`` YAML is a field read for its section (sections without a list are not checked)."""
    known = fields.get(section)
    for k, v in doc.items():
        name = f"{section}.{k}" if section else k
        if known is not None and k not in known:
            bad("flags.config-key", f"'{name}' is not a field of the --config YAML (extra fields are refused)")
        if isinstance(v, dict) and name in fields:
            _config_keys(v, name, fields, bad)


# ---------------------------------------------------------------------------------------------------------------
# The rule language
# ---------------------------------------------------------------------------------------------------------------

_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
        ast.Is: operator.is_, ast.IsNot: operator.is_not}
_METHODS = {"get", "startswith", "endswith", "lower", "upper", "keys"}
_BUILTINS = {"len": len, "min": min, "max": max, "str": str, "int": int, "abs": abs, "bool": bool,
             "all_in": lambda xs, allowed: all(x in allowed for x in xs)}


class RuleError(InputError):
    """A rule outside the language (a catalog error: exit 1 naming the rule)."""


def _dig(value, path: str, default):
    for part in [p for p in path.split(".") if p]:
        if not isinstance(value, dict) or part not in value:
            return default
        value = value[part]
    return value


def functions(cmd: Command, prefix: str = "") -> dict:
    """The functions rule expressions call for one command (names prefixed for pair rules)."""

    def has(f):
        return f in cmd.values

    def flag(f, default=None):
        return cmd.values.get(f, default)

    def json_(f, path="", default=None):
        raw = cmd.values.get(f)
        if not isinstance(raw, str):
            return default
        try:
            return _dig(json.loads(raw), path, default)
        except ValueError:
            return default

    fns = {"has": has, "flag": flag, "json": json_,
           "config": lambda path, default=None: _dig(cmd.config, path, default),
           "env": lambda name, default=None: cmd.env.get(name, default),
           "fact": lambda name, default=None: cmd.facts.get(name, default) if cmd.facts.get(name) is not None
           else default,
           "metrics": lambda: list(cmd.metrics)}
    return {prefix + k: v for k, v in fns.items()}


def evaluate(expr: str, names: dict):
    """Evaluate one rule expression; :class:`RuleError` for anything outside the language."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise RuleError(f"not an expression: {expr!r} ({e.msg})") from None
    return _eval(tree.body, names)


def _eval(node, names):  # noqa: C901  (one case per node type of the language)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_eval(e, names) for e in node.elts)
    if isinstance(node, ast.Dict):
        return {_eval(k, names): _eval(v, names) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.Name):
        if node.id in names:
            return names[node.id]
        raise RuleError(f"unknown name '{node.id}'")
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            v = True
            for e in node.values:
                v = _eval(e, names)
                if not v:
                    return v
            return v
        v = False
        for e in node.values:
            v = _eval(e, names)
            if v:
                return v
        return v
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, names)
        if isinstance(node.op, ast.Not):
            return not v
        if isinstance(node.op, ast.USub):
            return -v
        raise RuleError("unsupported unary operator")
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        a, b = _eval(node.left, names), _eval(node.right, names)
        if a is None or b is None:
            return None
        return _BIN[type(node.op)](a, b)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, names)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, names)
            if type(op) not in _CMP:
                raise RuleError("unsupported comparison")
            if (left is None or right is None) and type(op) in (ast.Lt, ast.LtE, ast.Gt, ast.GtE):
                return False
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, names) if _eval(node.test, names) else _eval(node.orelse, names)
    if isinstance(node, ast.Call):
        args = [_eval(a, names) for a in node.args]
        if isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS:
            obj = _eval(node.func.value, names)
            if obj is None:
                return None
            return getattr(obj, node.func.attr)(*args)
        if isinstance(node.func, ast.Name):
            if node.func.id == "first":
                return next((a for a in args if a is not None), None)
            fn = names.get(node.func.id) or _BUILTINS.get(node.func.id)
            if callable(fn):
                return fn(*args)
        raise RuleError(f"unknown function in {ast.unparse(node)!r}")
    raise RuleError(f"unsupported expression {ast.unparse(node)!r}")


def applies(rule: Rule, names: dict) -> tuple[bool, dict]:
    """Whether ``rule``'s ``when`` holds, and the names its ``require`` sees (``vars`` evaluated in order)."""
    scope = dict(names)
    try:
        for k, expr in rule.vars.items():
            scope[k] = evaluate(expr, scope)
        return bool(evaluate(rule.when, scope)), scope
    except RuleError as e:
        raise RuleError(f"rule {rule.id}: {e}") from None
    except (TypeError, AttributeError, ZeroDivisionError) as e:
        raise RuleError(f"rule {rule.id}: {type(e).__name__}: {e}") from None


def _holds(rule: Rule, names: dict) -> bool:
    when, scope = applies(rule, names)
    if not when:
        return True
    try:
        return bool(evaluate(rule.require, scope))
    except RuleError as e:
        raise RuleError(f"rule {rule.id}: {e}") from None
    except (TypeError, AttributeError, ZeroDivisionError) as e:
        raise RuleError(f"rule {rule.id}: {type(e).__name__}: {e}") from None


def check_command(cmd: Command, table: FlagTable, rules: list[Rule]) -> list[Violation]:
    """Flag findings and the command- and metrics-scope rules of ``cmd``'s engine release."""
    out = parse(cmd, table)
    names = functions(cmd)
    for r in rules:
        if r.scope in ("command", "metrics") and not _holds(r, names):
            out.append(Violation(cmd.pool, r.id, r.message, r.source, cmd.engine))
    return out


def check_pair(prefill: Command, decode: Command, rules_by_engine: dict[str, list[Rule]]) -> list[Violation]:
    """The pair rules of a prefill pool and the decode pool it hands KV to (both commands already parsed)."""
    names = {**functions(prefill, "prefill_"), **functions(decode, "decode_"),
             "same_engine": prefill.engine == decode.engine}
    rules = rules_by_engine.get(prefill.engine, []) + [r for r in rules_by_engine.get(decode.engine, [])
                                                         if decode.engine != prefill.engine]
    pool = f"{prefill.pool} -> {decode.pool}"
    return [Violation(pool, r.id, r.message, r.source) for r in rules if r.scope == "pair" and not _holds(r, names)]


def coverage(rules: list[Rule], emitted: dict[str, set[str]]) -> dict[str, int]:
    """Rules per engine whose expressions name a flag the export emits (``emitted``: engine -> flags)."""
    out: dict[str, int] = {}
    for r in rules:
        text = " ".join([r.when, r.require, *r.vars.values()])
        if any(f"'{f}'" in text for f in emitted.get(r.engine, set())) or r.scope in ("pair", "metrics"):
            out[r.engine] = out.get(r.engine, 0) + 1
    return out
