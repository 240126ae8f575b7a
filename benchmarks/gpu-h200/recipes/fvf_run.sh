#!/bin/bash
# The fast capacity procedure against the full one on the lent H200 (issue 27's "done
# when": 2 configs on the H200), with issue 27's workload (Qwen3-4B shape, random weights,
# 1024/256 tokens, --rate 16, 400 requests, warm-up 160, ttft_p99<=500ms,tpot_p99<=20ms):
# benchmarks/capacity_fast_vs_full.py on the engine defaults and run 13's winner, each on
# one server, both procedures in turn (order alternated).  Usage as trialcost_run.sh:
#   fvf_run.sh copy N | start | wait
# CONTROL=0 (or 0,1) on "start": the full procedure again after the fast one on those
# configs (capacity_fast_vs_full.py --control): does the full one agree with itself?
set -u
. "$(dirname "$0")/chain_lib.sh"
vllm_recipe_init
case "$1" in
copy)
  copy_part "$2"; exit 0 ;;
start)
  install_vllm_venv
  # the configs travel in a file (run 14's first chain start lost them to quoting:
  # the '}' of '{}' ends a ${VAR:-default} expansion)
  run13_winner='{"max_num_seqs": 442, "max_num_batched_tokens": 4096, "stream_interval": 1, "max_cudagraph_capture_size": 256}'
  configs=${CONFIGS:-}; [ -n "$configs" ] || configs="[{}, $run13_winner]"
  printf '%s' "$configs" > $Q/cfg.json
  echo 'CONFIGS=$(cat /tmp/qt/cfg.json)' > $Q/chain.sh
  echo "CONTROL='${CONTROL:-}'" >> $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-vllm/bin/python
s=$(date +%s)
$PY benchmarks/capacity_fast_vs_full.py --model examples/qwen3-4b --configs "$CONFIGS" \
  --input-len 1024 --output-len 256 --rate 16 --requests 400 --warmup 160 \
  --slo 'ttft_p99<=500ms,tpot_p99<=20ms' --no-floor ${CONTROL:+--control $CONTROL} --json $Q/result.json > $Q/console.txt 2>&1
echo "fvf rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
for f in result.json console.txt; do [ -f $Q/$f ] && cp $Q/$f $OUT/; done
tar czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls -d qtune-fvf-* 2>/dev/null) 2>/dev/null
tail -c 3000 $Q/console.txt 2>/dev/null
