"""The wheel installs anywhere (issue 45, deliver 3): built from this checkout, installed with pip into a fresh
virtual environment and run from an empty folder, it plans a scenario given by path, prints a roofline and a
price curve, and exports; a user's folder with one hardware file layers over the bundled catalog.

The environment has no site packages of its own beyond the wheel; the dependencies are reached through a
``.pth`` line naming this interpreter's site-packages folder as a plain path (so this checkout's editable
install, a meta-path hook, is not active there: ``import planner`` can only find the wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX venv layout")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(wheels), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    [wheel] = list(wheels.glob("*.whl"))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    Path(purelib, "outer_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    empty = tmp / "empty"
    empty.mkdir()
    return {"wheel": wheel, "venv": venv, "cwd": empty, "tmp": tmp}


def _run(inst, *args, ok=True):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PLANNER_CATALOG_DIR")}
    env["MPLBACKEND"] = "Agg"
    r = subprocess.run([str(inst["venv"] / "bin" / "planner"), *map(str, args)], cwd=inst["cwd"], env=env,
                       capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, (args, r.stderr[-3000:])
    return r


def test_wheel_carries_the_catalog(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    for sub in ("hardware", "models", "engines", "scenarios"):
        src = sorted(p.name for p in (ROOT / "catalogs" / sub).glob("*.yaml"))
        got = sorted(Path(n).name for n in names if n.startswith(f"planner/_catalogs/{sub}/") and n.count("/") == 3)
        assert src and got == src, sub
    # the engine releases' flag tables and start-up rules the export checks against
    releases = sorted(p.name for p in (ROOT / "catalogs" / "engines" / "releases").iterdir())
    got = sorted(Path(n).name for n in names if n.startswith("planner/_catalogs/engines/releases/"))
    assert releases and got == releases
    assert installed["wheel"].name.startswith("llm_serving_planner-")


def test_installed_package_is_the_wheel(installed):
    r = subprocess.run([str(installed["venv"] / "bin" / "python"), "-c", "import planner; print(planner.__file__)"],
                       cwd=installed["cwd"], capture_output=True, text=True, check=True)
    assert str(installed["venv"]) in r.stdout and str(ROOT) not in r.stdout


def test_commands_work_from_an_empty_folder(installed):
    r = _run(installed, "catalog", "validate")
    assert "_catalogs" in r.stdout
    scenario = ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml"
    _run(installed, "plan", scenario, "--out", "p1")
    doc = json.loads((installed["cwd"] / "p1" / "plan.json").read_text())
    assert doc["status"] == "optimal" and doc["pools"]
    r = _run(installed, "roofline", "--model", "llama-3.1-70b", "--hardware", "h200-sxm", "--batch", "32",
             "--context", "2048", "--tp", "4", "--json")
    assert json.loads(r.stdout)
    r = _run(installed, "price-curve", "--model", "llama-3.1-70b", "--hardware", "h200-sxm", "--json")
    assert json.loads(r.stdout)
    _run(installed, "export", "p1", "--target", "all", "--out", "ex")
    assert list((installed["cwd"] / "ex").glob("*/launch-vllm.sh"))


def test_user_catalog_layers_over_the_bundled_one(installed):
    mine = installed["tmp"] / "mine"
    (mine / "hardware").mkdir(parents=True)
    doc = yaml.safe_load((ROOT / "catalogs" / "hardware" / "h200-sxm.yaml").read_text())
    doc.update(id="my-h200", aliases=[])
    doc["price"]["usd_per_chip_hour"] = 1.0
    (mine / "hardware" / "my-h200.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    r = _run(installed, "--catalog", mine, "catalog", "validate")
    assert "over the bundled catalog" in r.stdout
    sc = yaml.safe_load((ROOT / "catalogs" / "scenarios" / "llama-70b-chat.yaml").read_text())
    sc["hardware"] = ["my-h200", "h100-sxm"]  # a user entry beside a bundled one
    (installed["cwd"] / "mine.yaml").write_text(yaml.safe_dump(sc, sort_keys=False))
    _run(installed, "--catalog", mine, "plan", "mine.yaml", "--out", "p2")
    pools = json.loads((installed["cwd"] / "p2" / "plan.json").read_text())["pools"]
    assert {p["hardware"] for p in pools} == {"my-h200"}  # the cheaper user entry wins
    # --catalog-alone: the user's folder only (no bundled models: the scenario's model is unknown)
    r = _run(installed, "--catalog", mine, "--catalog-alone", "plan", "mine.yaml", "--out", "p3", ok=False)
    assert r.returncode == 1 and "model" in r.stderr and "Traceback" not in r.stderr
    shutil.rmtree(mine)
