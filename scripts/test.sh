#!/usr/bin/env bash
# Set up, lint (ruff), type-check (mypy --strict on qtune/), build the docs
# (mkdocs --strict), then run the whole test suite in tiers: the fast tier,
# the fast tier again on the declared dependency floors, then the tests that
# start real engines, PostgreSQL or other processes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! command -v systemd-analyze >/dev/null && [ "$(id -u)" = 0 ]; then
  # The emitter's units are checked by the real systemd-analyze.
  apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
if { ! command -v systemd-nspawn >/dev/null || ! command -v debootstrap >/dev/null; } \
    && [ "$(id -u)" = 0 ]; then
  # An emitted unit is started by a real systemd, PID 1 of a container over a
  # minimal Debian (tests/emit/test_systemd_boot.py): this host's PID 1 is not systemd.
  apt-get update -qq && apt-get install -y -qq --no-install-recommends \
    systemd-container debootstrap >/dev/null
fi
if ! command -v docker-compose >/dev/null && [ "$(id -u)" = 0 ]; then
  # Compose files are checked by docker-compose's own `config` (no engine needed).
  apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi
if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ]; then
  # Emitted alert rules are checked by the real promtool (Debian's prometheus).
  apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
if ! command -v chromium-headless-shell >/dev/null && [ "$(id -u)" = 0 ]; then
  # The HTML report is looked at in a real headless browser
  # (tests/test_report_screenshot.py; Debian's package, no download of its own).
  apt-get update -qq && apt-get install -y -qq --no-install-recommends \
    chromium-headless-shell >/dev/null
fi
if ! compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null && ! command -v pg_ctl >/dev/null \
    && [ "$(id -u)" = 0 ]; then
  # The fleet tests start a real PostgreSQL server (tests/fleet/conftest.py runs
  # it as an unprivileged user, since PostgreSQL refuses root).
  apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
if [ ! -x .venv-checkov/bin/checkov ]; then
  # Kubernetes manifests are checked by Checkov's policies, a checker operators
  # run (tests/emit/test_kubernetes.py), in a venv of its own: its pins are not
  # qtune's.  Offline once installed (--skip-download); its test skips without it.
  { python3 -m venv .venv-checkov && .venv-checkov/bin/pip install -q \
      --disable-pip-version-check 'checkov==3.3.30'; } >/dev/null 2>&1 ||
    echo "warning: scripts/test.sh: checkov did not install; its tests skip" >&2
fi
# The habits the house keeps, checked before the tests: lint (benchmarks
# are scripts but are read like the package) and strict types on qtune/.
.venv/bin/python -m ruff check qtune tests benchmarks || {
  echo "error: scripts/test.sh: ruff check failed (step: lint)" >&2; exit 1; }
.venv/bin/python -m mypy || {
  echo "error: scripts/test.sh: mypy failed (step: type check, config in pyproject.toml)" >&2
  exit 1; }
# The documentation site, warnings as errors (a broken link or anchor, a page
# left out of the navigation), built into a folder of its own and removed; its
# log is shown only when it fails (--quiet would hide the warnings from --strict).
SITE=$(mktemp -d)
if ! DOCS_LOG=$(NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict -d "$SITE" 2>&1)
then
  rm -rf "$SITE"; echo "$DOCS_LOG" >&2
  echo "error: scripts/test.sh: mkdocs build --strict failed (step: docs, config in mkdocs.yml)" >&2
  exit 1
fi
rm -rf "$SITE"
# The fast tier first (no real engine, no PostgreSQL, nothing that runs for
# seconds: tests/conftest.py marks it), so a broken unit fails in minutes;
# then the same tier on the lowest versions pyproject.toml declares
# (scripts/floors.sh); then the rest.  --durations prints where the time went.
# The fast tier runs on one worker per core, up to 4 (pytest-xdist): on the
# 2-core VM 2 min 05 s against 3 min 53 s serial.  The rest stays serial: its
# tests start real servers and measure them, and two would share the cores.
.venv/bin/python -m pytest -q -m fast -n auto --maxprocesses=4 --durations=15 "$@" || {
  echo "error: scripts/test.sh: the fast tier failed (step: pytest -m fast)" >&2; exit 1; }
if [ -z "${QTUNE_SKIP_FLOORS:-}" ]; then
  bash scripts/floors.sh -q --durations=5 "$@" || {
    echo "error: scripts/test.sh: the fast tier failed on the declared floors" \
      "(step: scripts/floors.sh; QTUNE_SKIP_FLOORS=1 skips it offline)" >&2; exit 1; }
fi
exec .venv/bin/python -m pytest -q -m "not fast" --durations=25 "$@"
