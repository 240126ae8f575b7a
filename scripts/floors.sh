#!/usr/bin/env bash
# The fast tests on the lowest versions pyproject.toml declares (issue 27, item 7): a
# virtual environment of its own (.venv-floors) resolved with uv's lowest-direct strategy,
# so that every direct dependency (Optuna, typer, pandas, ...) sits at its floor.  Called by
# scripts/test.sh after the fast tier; needs the network (PyPI) the first time.
# Usage: floors.sh --prepare | floors.sh [PYTEST_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/uv ] || .venv/bin/python -m pip install --disable-pip-version-check -q 'uv>=0.5'
if [ ! -x .venv-floors/bin/python ]; then
  .venv/bin/uv venv -q --python "$(.venv/bin/python -c 'import sys; print(sys.executable)')" \
    .venv-floors
fi
# uv ignores pip's configuration: the floors come from PyPI as declared, not from a local
# wheel folder that may hold other versions.
.venv/bin/uv pip install -q --python .venv-floors/bin/python --resolution lowest-direct \
  -e '.[test,fleet]'
# --prepare: only build the environment (scripts/test.sh does it in the background
# while the lint, the type check and the fast tier run).
[ "${1:-}" = --prepare ] && exit 0
.venv-floors/bin/python - <<'EOF'
import importlib.metadata as md
from qtune.deps import declared
print("floors:", ", ".join(f"{r.name} {md.version(r.name)}" for r in declared()))
EOF
# No engine in this venv (vLLM pins its own numpy, torch, ...): the tests that read
# the installed engine run in the main venv only.
unset QTUNE_REQUIRE_VLLM
exec .venv-floors/bin/python -m pytest -q -m "fast and not engine" -p no:cacheprovider \
  -n auto --maxprocesses=4 "$@"
