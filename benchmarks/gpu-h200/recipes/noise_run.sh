#!/bin/bash
# Where the verdict noise near the knee comes from, on one GPU server (issue 27: run 25
# read TPOT p99 20.9, 16.6, 18.3, 20.2, 12.6 and 18.8 ms at one load on one server):
# benchmarks/verdict_noise.py --arrivals alternate on the engine defaults with issue 27's
# workload (Qwen3-4B shape, random weights, 1024/256 tokens, 400 requests a window,
# warm-up 160, ttft_p99<=500ms,tpot_p99<=20ms), every probe a whole window: at each load,
# probes with one shared arrival pattern against probes with patterns of their own (the
# prompts fresh in both).  Then, on "fvf", benchmarks/capacity_fast_vs_full.py as
# fvf_run.sh runs it, on the same machine.  Usage as trialcost_run.sh:
#   noise_run.sh copy N | start | fvf | wait
# LOADS (default 20), ROUNDS (default 8), PARAMS (default {}) on "start"; CONFIGS and
# CONTROL on "fvf" as in fvf_run.sh, and FVF_ARGS (e.g. --shared-arrivals).
set -u
. "$(dirname "$0")/chain_lib.sh"
vllm_recipe_init
case "$1" in
copy)
  copy_part "$2"; exit 0 ;;
start)
  install_vllm_venv
  printf '%s' "${PARAMS:-{\}}" > $Q/params.json
  cat > $Q/chain.sh <<EOC
LOADS='${LOADS:-20}'; ROUNDS='${ROUNDS:-8}'
EOC
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-vllm/bin/python
s=$(date +%s)
$PY benchmarks/verdict_noise.py --model examples/qwen3-4b --params "$(cat $Q/params.json)" \
  --loads "$LOADS" --repeats "$ROUNDS" --whole --arrivals alternate \
  --input-len 1024 --output-len 256 --requests 400 --warmup 160 \
  --slo 'ttft_p99<=500ms,tpot_p99<=20ms' --json $Q/result.json > $Q/console.txt 2>&1
echo "noise rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
touch $Q/DONE
EOC
  start_chain
  ;;
fvf)
  # the repo as this call carries it; the venv the "start" call installed
  date +%s > $Q/t0; rm -f $Q/DONE
  rm -rf /tmp/qrepo/benchmarks /tmp/qrepo/qtune && cp -r qtune benchmarks /tmp/qrepo/
  fvf_chain fvf.json fvf.txt
  start_chain
  ;;
esac
wait_chain
for f in result.json console.txt fvf.json fvf.txt probe.txt; do [ -f $Q/$f ] && cp $Q/$f $OUT/; done
tar czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls -d qtune-noise-* qtune-fvf-* 2>/dev/null) 2>/dev/null
tail -c 3000 $Q/console.txt 2>/dev/null; tail -c 2000 $Q/fvf.txt 2>/dev/null
