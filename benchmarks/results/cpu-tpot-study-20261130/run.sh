#!/bin/bash
# waits for the judge, then a CPU study on TPOT under a TTFT SLO, then verify
while pgrep -f judge_picks.py >/dev/null; do sleep 5; done
cd /tmp/tpot
export PYTHONPATH=/tmp/jclone
PY=/work/main/.venv/bin/python
s=$(date +%s)
$PY -m qtune search --concurrency 16 --input-len 256 --output-len 64 --requests 300 --warmup 32 \
  --objective tpot_p99 --slo 'ttft_p99<=2000ms' --trials 6 --confirm-top 2 --confirm-repeats 1 \
  --study cpu-tpot --out profiles/cpu-tpot.yaml > search.out 2> search.err
echo "search rc=$? wall_s=$(( $(date +%s)-s ))" >> chain.log
s=$(date +%s)
$PY -m qtune verify profiles/cpu-tpot.yaml --repeat 3 > verify.out 2> verify.err
echo "verify rc=$? wall_s=$(( $(date +%s)-s ))" >> chain.log
$PY -m qtune report cpu-tpot --html report.html > report.out 2>&1 ; echo "report rc=$?" >> chain.log
touch DONE
