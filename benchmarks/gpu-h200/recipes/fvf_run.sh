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
  fvf_chain result.json console.txt
  start_chain
  ;;
esac
wait_chain
for f in result.json console.txt; do [ -f $Q/$f ] && cp $Q/$f $OUT/; done
tar czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls -d qtune-fvf-* 2>/dev/null) 2>/dev/null
tail -c 3000 $Q/console.txt 2>/dev/null
