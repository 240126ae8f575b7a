#!/bin/bash
# Does the capacity qtune finds, re-measured over two windows, hold under vLLM's own client
# (issue 27: "the winner's and the defaults' capacities hold under vLLM's own client at those
# rates, fresh prompts, twice the window")?  On the device machine from the repo copy:
#   holdcheck_run.sh copy N   copy the carried vLLM part .vwheels/pN to /tmp/wh/v
#   holdcheck_run.sh start    copy the last part (.vwheels/p$LAST; carry all.sha and .qwheels),
#                             install as trialcost_run.sh does, then in the background (setsid),
#                             for each config in $CONFIGS (JSON launch params, ';'-separated;
#                             {} = the engine defaults): benchmarks/capacity_crosscheck.py on a
#                             fresh server with issue 27's workload and SLO (qtune bench
#                             --find-capacity, whose answer is re-measured over two windows;
#                             then vLLM's client and qtune's over twice the longest probe);
#                             then wait; HOLD_ARGS adds capacity_crosscheck.py flags
#                             (e.g. '--client-windows 2 --no-qtune')
#   holdcheck_run.sh wait     wait for the background chain
# Each call copies what exists into $OUT, so a call cut short loses only its own part.
set -u
. "$(dirname "$0")/chain_lib.sh"
vllm_recipe_init
case "$1" in
copy)
  copy_part "$2"; exit 0 ;;
start)
  install_vllm_venv
  echo "CONFIGS='${CONFIGS:-{\}}'; HOLD_ARGS='${HOLD_ARGS:-}'" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; export PYTHONPATH=/tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-vllm/bin/python  # the scripts import qtune from the repo
i=0
IFS=';' read -ra CS <<< "$CONFIGS"
for c in "${CS[@]}"; do
  s=$(date +%s)
  $PY benchmarks/capacity_crosscheck.py --model examples/qwen3-4b --params "$c" \
    --input-len 1024 --output-len 256 --rate 16 --requests 400 --warmup 160 \
    --slo 'ttft_p99<=500ms,tpot_p99<=20ms' ${HOLD_ARGS:-} --json $Q/hold-$i.json > $Q/hold-$i.log 2>&1
  echo "config $i $c rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
  i=$((i+1))
  # the kernels a machine JIT-compiles on its first start (Triton, FlashInfer's sampling),
  # for a later run to carry as a host that has run vLLM before
  tar czf /tmp/jit-cache.tgz -C ~ .triton .cache/flashinfer 2>/dev/null
done
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
cp $Q/hold-*.json $Q/hold-*.log $Q/probe.txt $OUT/ 2>/dev/null
[ -f /tmp/jit-cache.tgz ] && cp /tmp/jit-cache.tgz $OUT/
tar czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls -d qtune-capacity-* 2>/dev/null) 2>/dev/null
for f in $Q/hold-*.log; do [ -f $f ] && { echo "== $f"; tail -c 2500 $f; }; done
