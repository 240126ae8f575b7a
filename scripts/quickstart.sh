#!/usr/bin/env bash
# Set up, probe this host, tune the embedded tiny model on the installed vLLM
# (3 trials: the engine defaults first, then 2 of Optuna's picks; the two best
# and the defaults re-measured with a fresh start), and turn the winning profile into a systemd
# unit.  About 4 minutes after the install.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/qtune probe
.venv/bin/qtune search --trials "${TRIALS:-3}" --study quickstart \
  --confirm-top 2 --confirm-repeats 1 --out profiles/quickstart.yaml
echo; echo "== profiles/quickstart.yaml"; cat profiles/quickstart.yaml
.venv/bin/qtune emit profiles/quickstart.yaml --format systemd -o profiles/quickstart.service
echo; echo "== profiles/quickstart.service"; cat profiles/quickstart.service
if command -v systemd-analyze >/dev/null; then
  systemd-analyze verify --man=no --generators=no profiles/quickstart.service \
    && echo "systemd-analyze verify: OK"
fi
