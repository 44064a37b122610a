#!/usr/bin/env bash
# Install the lowest versions pyproject.toml allows (uv's lowest-direct resolution) into a fresh Python 3.11
# virtual environment and run the Quickstart plan and the test suite there: the floors must be versions the
# code really runs on.
#   bash bench/lowest_deps.sh [pytest args...]     (default: the whole suite)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v uv >/dev/null || python -m pip install -q uv
VENV="${LOWEST_VENV:-$(mktemp -d)/venv}"
uv venv -q --seed -p 3.11 "$VENV"  # --seed: pip and setuptools, as python -m venv gives (tests/test_install.py builds a wheel with pip)
VIRTUAL_ENV="$VENV" uv pip install -q --compile-bytecode --resolution lowest-direct -e '.[test]'  # compiled as pip does: a worker's first import is not a compile
echo "lowest direct dependencies:"
VIRTUAL_ENV="$VENV" uv pip list 2>/dev/null | grep -iE '^(pydantic|pyyaml|numpy|pandas|scipy|pyomo|highspy|typer|rich|matplotlib|pyarrow) '
"$VENV/bin/python" -m planner plan catalogs/scenarios/deepseek-chat.yaml --out "$(dirname "$VENV")/plan" --force
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests}"
