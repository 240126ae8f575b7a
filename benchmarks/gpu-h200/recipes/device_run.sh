#!/bin/bash
# Runs on the device machine from the repo copy.  Usage:
#   device_run.sh copy N   copy the carried wheel part folder .gpuwheels/pN to /tmp/wh
#                          (parts of 48 MB: the repo and one part must stay under 64 MiB)
#   device_run.sh start    copy the last part (.gpuwheels/p$LAST, 7), join the parts, install into /tmp/site, probe, then run
#                          search -> emit -> verify in the background (setsid), and wait
#   device_run.sh wait     wait for the background chain
# The study's extra flags come from $SEARCH_ARGS (say --trials 12 --time-budget 14 on
# nvidia-h200-x2, where tensor_parallel_size 1|2 joins the space by itself).
# RESUME=benchmarks/gpu-h200/run5/h200-journal.log continues that study (its journal
# comes back in logs.tgz): trials already run, the baseline among them, are not
# paid for again.  VERIFY=0 skips verify (give it a session of its own).
# start and wait copy what exists into $OUT.  The chain runs from a copy of the
# repo in /tmp/qrepo: the device re-syncs the working tree on every call.
set -u
. "$(dirname "$0")/chain_lib.sh"
export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONPATH=/tmp/site:/tmp/qrepo
Q=/tmp/qt; mkdir -p $Q /tmp/wh
T_CALL=$(date +%s)
case "$1" in
copy)
  cp .gpuwheels/p$2/* /tmp/wh/ && ls -la /tmp/wh && nvidia-smi -L; exit 0 ;;
start)
  date +%s > $Q/t0; REPO=$PWD
  rm -rf /tmp/qrepo && mkdir -p /tmp/qrepo && cp -r qtune examples pyproject.toml /tmp/qrepo/ \
    && mkdir -p /tmp/qrepo/studies /tmp/qrepo/profiles
  cp .gpuwheels/p${LAST:-7}/* /tmp/wh/ && cd /tmp/wh && cat $(ls part.* | sort -t. -k2 -n) \
    > all.tar && sha256sum all.tar && mkdir -p w && tar xf all.tar -C w && rm -f part.* all.tar || exit 3
  t=$(date +%s); python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site /tmp/wh/w/*.whl 2>&1 | tail -3; echo "install_s=$(( $(date +%s)-t ))"
  cd /tmp/qrepo
  python3 -c "import vllm, optuna, typer, qtune.cli; print('vllm', vllm.__version__, 'optuna', optuna.__version__)" 2>&1 | tail -2
  python3 -m qtune probe --json > $Q/probe.json 2> $Q/probe.err; echo "probe json rc=$?"
  python3 -m qtune probe > $Q/probe.txt 2>&1; echo "probe rc=$?"
  [ -n "${RESUME:-}" ] && cp "$REPO/$RESUME" $Q/h200.log && echo "resuming $RESUME"
  echo "SEARCH_ARGS='${SEARCH_ARGS:---trials 9 --time-budget 12}'; VERIFY=${VERIFY:-1}" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt
s=$(date +%s)
python3 -m qtune search --model examples/qwen3-4b --input-len 1024 --output-len 256 --rate 40 \
  --requests 800 --warmup 160 --seed 1 $SEARCH_ARGS --confirm-top 0 \
  --storage journal:///tmp/qt/h200.log --study h200-qwen3-4b --out $Q/h200-qwen3-4b.yaml \
  --json > $Q/search.json 2> $Q/search.err
echo "search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
python3 -m qtune emit $Q/h200-qwen3-4b.yaml --format systemd -o $Q/h200-qwen3-4b.service > $Q/emit.out 2>&1
echo "emit rc=$?" >> $Q/chain.log
s=$(date +%s)
if [ "$VERIFY" = 1 ]; then
  python3 -m qtune verify $Q/h200-qwen3-4b.yaml --repeat 3 --json > $Q/verify.json 2> $Q/verify.err
  echo "verify rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
fi
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
for f in probe.json probe.txt h200-qwen3-4b.yaml h200-qwen3-4b.service search.json verify.json; do
  [ -f $Q/$f ] && cp $Q/$f $OUT/; done
cat $Q/probe.err $Q/search.err $Q/emit.out $Q/verify.err $Q/chain.out 2>/dev/null > $OUT/console.txt
tar czf $OUT/logs.tgz -C /tmp/qrepo studies -C $Q h200.log chain.log 2>/dev/null
tail -c 2500 $Q/search.err 2>/dev/null; tail -c 800 $Q/verify.err 2>/dev/null
