#!/usr/bin/env bash
# Set up, lint (ruff), type-check (mypy --strict on qtune/), build the docs
# (mkdocs --strict), then run the whole test suite in tiers: the fast tier,
# the fast tier again on the declared dependency floors, then the tests that
# start real engines, PostgreSQL or other processes.
set -euo pipefail
cd "$(dirname "$0")/.."
# The real validators and processes the tests use, from Debian's packages:
# one `apt-get update` and one install for whatever is missing.  They install
# in the background while setup.sh installs the Python side (a fresh CI
# machine lacks both), and are waited for before the first check.
APT=()
# The emitter's units are checked by the real systemd-analyze.
command -v systemd-analyze >/dev/null || APT+=(systemd)
# An emitted unit is started by a real systemd, PID 1 of a container over a
# minimal Debian (tests/emit/test_systemd_boot.py): this host's PID 1 is not systemd.
command -v systemd-nspawn >/dev/null || APT+=(systemd-container)
command -v debootstrap >/dev/null || APT+=(debootstrap)
# Compose files are checked by docker-compose's own `config` (no engine needed).
command -v docker-compose >/dev/null || APT+=(docker-compose)
# Emitted alert rules are checked by the real promtool (Debian's prometheus).
command -v promtool >/dev/null || APT+=(prometheus)
# The HTML report is looked at in a real headless browser
# (tests/test_report_screenshot.py; Debian's package, no download of its own).
command -v chromium-headless-shell >/dev/null || APT+=(chromium-headless-shell)
# The fleet tests start a real PostgreSQL server (tests/fleet/conftest.py runs
# it as an unprivileged user, since PostgreSQL refuses root).
compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null || command -v pg_ctl >/dev/null ||
  APT+=(postgresql)
LOGS=$(mktemp -d)
# The background steps' logs, kept until the step that reads them; removed on
# any exit (and by hand before the last step, which replaces this shell).
trap 'rm -rf "$LOGS"' EXIT
APT_PID=
if [ ${#APT[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${APT[@]}"; } \
    >"$LOGS/apt.log" 2>&1 &
  APT_PID=$!
fi
CHECKOV_PID=
if [ ! -x .venv-checkov/bin/checkov ]; then
  # Kubernetes manifests are checked by Checkov's policies, a checker operators
  # run (tests/emit/test_kubernetes.py), in a venv of its own: its pins are not
  # qtune's.  Offline once installed (--skip-download); its test skips without it.
  { python3 -m venv .venv-checkov && .venv-checkov/bin/pip install -q \
      --disable-pip-version-check 'checkov==3.3.30'; } >"$LOGS/checkov.log" 2>&1 &
  CHECKOV_PID=$!
fi
bash scripts/setup.sh
if [ -n "$APT_PID" ] && ! wait "$APT_PID"; then
  tail -20 "$LOGS/apt.log" >&2
  echo "error: scripts/test.sh: apt-get install ${APT[*]} failed (step: system packages)" >&2
  exit 1
fi
if [ -n "$CHECKOV_PID" ] && ! wait "$CHECKOV_PID"; then
  echo "warning: scripts/test.sh: checkov did not install; its tests skip" >&2
fi
FLOORS_PID=
if [ -z "${QTUNE_SKIP_FLOORS:-}" ]; then
  # The floors' environment (PyPI downloads, mostly waiting) is built meanwhile.
  bash scripts/floors.sh --prepare >"$LOGS/floors.log" 2>&1 &
  FLOORS_PID=$!
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
# 2-core VM 2 min 05 s against 3 min 53 s serial.
.venv/bin/python -m pytest -q -m fast -n auto --maxprocesses=4 --durations=15 "$@" || {
  echo "error: scripts/test.sh: the fast tier failed (step: pytest -m fast)" >&2; exit 1; }
if [ -n "$FLOORS_PID" ]; then
  wait "$FLOORS_PID" || { tail -20 "$LOGS/floors.log" >&2
    echo "error: scripts/test.sh: the floors' environment did not install" \
      "(step: scripts/floors.sh --prepare; QTUNE_SKIP_FLOORS=1 skips it offline)" >&2; exit 1; }
  bash scripts/floors.sh -q --durations=5 "$@" || {
    echo "error: scripts/test.sh: the fast tier failed on the declared floors" \
      "(step: scripts/floors.sh; QTUNE_SKIP_FLOORS=1 skips it offline)" >&2; exit 1; }
fi
rm -rf "$LOGS"
# The tests of fake engines, PostgreSQL and other processes (`pg`, `slow`) mostly
# wait on timeouts, heartbeats and restarts: on the 2-core VM 11 min 31 s serial
# used 3 min 39 s of CPU, and four workers took 3 min 49 s (two: 5 min 53 s).
.venv/bin/python -m pytest -q -m "not fast and not e2e and not measures" -n 4 \
    --durations=15 "$@" || {
  echo "error: scripts/test.sh: the pg/slow tier failed" \
    "(step: pytest -m 'not fast and not e2e and not measures')" >&2
  exit 1; }
# Last, serially, the tests that start a real engine and measure it (`e2e`) and
# those judged on a stand-in's measured latency (`measures`): two at once would
# share the cores and each would measure the other (on four workers CI failed
# two `measures` tests that pass alone).
exec .venv/bin/python -m pytest -q -m "e2e or measures" --durations=25 "$@"
