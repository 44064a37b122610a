"""The reader of an engine's flags from its wheel (issue 44 item 1): SGLang's annotated-field rules, on sources
shaped like ``sglang/srt/arg_groups/fields/*.py`` and ``server_args.add_cli_args`` (no wheel or network needed)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("efw", HERE / "data" / "engine_flags_from_wheel.py")
efw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(efw)

FIELDS = '''
from typing import List, Literal, Optional
CHOICES_X = ["nixl", "mooncake"]

class Disagg(msgspec.Struct):
    disaggregation_mode: A[Literal["null", "prefill", "decode"], "PD role."] = "null"
    disaggregation_transfer_backend: A[str, Arg(help="Backend.", choices=CHOICES_X)] = "mooncake"
    disaggregation_bootstrap_port: A[int, "Bootstrap port."] = 8998
    enable_thing: A[bool, "A switch."] = False
    tp_size: A[int, Arg(help="TP.", cli_name="--tensor-parallel-size", aliases=["--tp-size"])] = 1
    hidden: A[int, Arg(help="x", no_cli=True)] = 0
    urls: A[Optional[List[str]], "Some URLs."] = None
    plain: int = 3
'''

SERVER_ARGS = '''
def add_cli_args(parser):
    parser.add_argument("--config", type=str, help="YAML.")
    parser.add_argument("--enable-dp-attention", action=DeprecatedStoreTrueAction, help="Deprecated.")
'''


def test_field_flags_follow_the_annotated_field_rules():
    flags = efw.field_flags(FIELDS, efw._constants(ast.parse(FIELDS)))
    assert flags["--disaggregation-mode"]["choices"] == ["null", "prefill", "decode"]
    assert flags["--disaggregation-transfer-backend"]["choices"] == ["nixl", "mooncake"]  # a module constant
    assert flags["--disaggregation-bootstrap-port"] == {**flags["--disaggregation-bootstrap-port"], "type": "int",
                                                        "default": 8998, "takes_value": True}
    assert flags["--enable-thing"]["takes_value"] is False  # bool: store_true
    assert flags["--tensor-parallel-size"]["aliases"] == ["--tp-size"] and "--tp-size" not in flags
    assert "--hidden" not in flags and "--plain" not in flags  # no_cli, and a field without CLI metadata
    assert flags["--urls"]["type"] == "list[str]" and flags["--urls"]["takes_value"]


def test_manual_flags_mark_deprecated_spellings():
    flags = efw.manual_flags(SERVER_ARGS, {})
    assert flags["--config"]["takes_value"] and not flags["--config"]["deprecated"]
    assert flags["--enable-dp-attention"] == {**flags["--enable-dp-attention"], "takes_value": False, "deprecated": True}


def test_only_sglang_is_read_so_far(capsys):
    assert efw.main(["vllm==0.33.0"]) == 1
    assert "only sglang" in capsys.readouterr().err
