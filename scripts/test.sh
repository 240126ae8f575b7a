#!/usr/bin/env bash
# Set up, then run the whole test suite: fast unit tests plus a few
# end-to-end tests that start a real vLLM (about 6 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v systemd-analyze >/dev/null && [ "$(id -u)" = 0 ]; then
  # The emitter's units are checked by the real systemd-analyze.
  apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
if ! command -v docker-compose >/dev/null && [ "$(id -u)" = 0 ]; then
  # Compose files are checked by docker-compose's own `config` (no engine needed).
  apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
exec .venv/bin/python -m pytest -q "$@"
