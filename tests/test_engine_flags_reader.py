"""The readers of an engine's flags from its wheel (issue 44 item 1): SGLang's annotated-field rules, on sources
shaped like ``sglang/srt/arg_groups/fields/*.py`` and ``server_args.add_cli_args``; vLLM's ``get_kwargs`` rules on
a small wheel-shaped zip (no real wheel or network needed)."""

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


def test_unknown_engine_is_refused(capsys):
    assert efw.main(["foo==1.0"]) == 1
    assert "give sglang==VERSION" in capsys.readouterr().err


VLLM_CONFIG = '''
from typing import Literal
from pydantic.dataclasses import dataclass
All2AllBackend = Literal["allgather_reducescatter", "deepep_low_latency"]
CacheDType = Literal["auto", "fp8"]

@config
class EPLBConfig:
    window_size: int = 1000

@config
class ParallelConfig:
    tensor_parallel_size: int = 1
    enable_dbo: bool = False
    all2all_backend: All2AllBackend = "allgather_reducescatter"
    eplb_config: EPLBConfig = Field(default_factory=EPLBConfig)
    cache_dtype: CacheDType | str = "auto"
    served_model_name: str | list[str] | None = None
    ratio: float = 0.9
    _private: int = 0
'''

VLLM_ARG_UTILS = '''
from vllm.config.parallel import ParallelConfig

class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        parallel_kwargs = get_kwargs(ParallelConfig)
        g = parser.add_argument_group()
        g.add_argument("--tensor-parallel-size", "-tp", **parallel_kwargs["tensor_parallel_size"])
        g.add_argument("--enable-dbo", **parallel_kwargs["enable_dbo"])
        g.add_argument("--all2all-backend", **parallel_kwargs["all2all_backend"])
        g.add_argument("--eplb-config", **parallel_kwargs["eplb_config"])
        g.add_argument("--kv-cache-dtype", **{**parallel_kwargs["cache_dtype"], "default": None})
        g.add_argument("--served-model-name", **parallel_kwargs["served_model_name"])
        g.add_argument("--gpu-memory-utilization", **parallel_kwargs["ratio"])
        g.add_argument("--data-parallel-size-local", "-dpl", type=int)
        g.add_argument("--old-flag", action=DeprecatedOldAction)
        return parser

class AsyncEngineArgs(EngineArgs):
    pass
'''

VLLM_CLI = '''
class BaseFrontendArgs:
    host: str | None = None
    enable_log: bool = False

@config
class FrontendArgs(BaseFrontendArgs):
    port: int = 8000

def make_arg_parser(parser):
    parser.add_argument("--headless", action="store_true")
    return parser
'''


def test_vllm_flags_follow_get_kwargs(tmp_path):
    """vLLM's flags from a wheel-shaped zip: a config field's type decides choices, switches (--x / --no-x), JSON
    values and lists; spreads in a dict literal resolve; the frontend adds every field of its dataclass."""
    import sys
    import zipfile

    whl = tmp_path / "vllm-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("vllm/config/parallel.py", VLLM_CONFIG)
        z.writestr("vllm/engine/arg_utils.py", VLLM_ARG_UTILS)
        z.writestr("vllm/entrypoints/common/cli_args.py", VLLM_CLI)
    sys.path.insert(0, str(HERE / "data"))
    from vllm_flags import vllm_flags

    f = vllm_flags(whl)
    assert f["--tensor-parallel-size"]["aliases"] == ["-tp"] and f["--tensor-parallel-size"]["type"] == "int"
    assert f["--enable-dbo"]["takes_value"] is False and "--no-enable-dbo" in f["--enable-dbo"]["aliases"]
    assert f["--all2all-backend"]["choices"] == ["allgather_reducescatter", "deepep_low_latency"]
    assert f["--eplb-config"]["type"] == "json"
    assert f["--kv-cache-dtype"]["choices"] is None and f["--kv-cache-dtype"]["known_values"] == ["auto", "fp8"]
    assert f["--served-model-name"]["nargs"] == "+"
    assert f["--gpu-memory-utilization"]["type"] == "float"
    assert f["--data-parallel-size-local"]["type"] == "int" and f["--data-parallel-size-local"]["aliases"] == ["-dpl"]
    assert f["--old-flag"]["deprecated"] is True
    assert f["--headless"]["takes_value"] is False
    assert f["--port"]["type"] == "int" and f["--host"]["takes_value"] is True
    assert f["--enable-log"]["takes_value"] is False  # inherited from the frontend's base class
