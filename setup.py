"""Build hook: the wheel carries the repository's ``catalogs/`` as ``planner/_catalogs``.

The catalog stays at the top of the repository (the layout the project documents: ``catalogs/hardware``,
``catalogs/models``, ``catalogs/engines``, ``catalogs/scenarios``); an installed package finds its copy with
``planner.catalog.loader.bundled_catalog_dir``. Everything else is declared in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithCatalogs(build_py):
    def run(self) -> None:
        super().run()
        src = HERE / "catalogs"
        dest = Path(self.build_lib) / "planner" / "_catalogs"
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.pyc", "__pycache__", ".*"))


setup(cmdclass={"build_py": BuildWithCatalogs})
