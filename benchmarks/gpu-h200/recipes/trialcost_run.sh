#!/bin/bash
# A verified capacity answer within 30 GPU-minutes (issue 27) on the lent H200: runs on the
# device machine from the repo copy.  Usage:
#   trialcost_run.sh copy N   copy the carried vLLM part .vwheels/pN to /tmp/wh/v
#   trialcost_run.sh start    copy the last part (.vwheels/p$LAST; carry all.sha and .qwheels),
#                             join and check the set, install it into a venv that sees the
#                             image's torch 2.11 after its own packages, then run in the
#                             background (setsid): the issue's study as a user types it, with
#                             --time-budget 20 (default space: lossless on random weights),
#                             its report and emitted files, then the winner's and the engine
#                             defaults' capacities measured again by vLLM's own client on fresh
#                             starts, at what each held on its confirmation's fresh start, over
#                             twice the window (engines_crosscheck.py --which winner,defaults
#                             --at confirmed --scale 2; XARGS overrides the last two); wait
#   trialcost_run.sh wait     wait for the background chain
# JIT_CACHE=benchmarks/gpu-h200/run16-trialcost/raw/triton-cache.tgz on "start": measure a
# host that has run vLLM 0.26 before (its Triton kernels; see the start step).
# pack_vllm_parts.sh builds .vwheels/ from vLLM 0.26.0's list and recipes/qtune_wheels.txt.
# Each call copies what exists into $OUT (run.tgz with the journal, logs and outputs), so a
# call cut short loses only its own part.
set -u
. "$(dirname "$0")/chain_lib.sh"
vllm_recipe_init
case "$1" in
copy)
  copy_part "$2"; exit 0 ;;
start)
  install_vllm_venv
  # JIT_CACHE=PATH (a .tgz of ~/.triton and ~/.cache/flashinfer, relative to the repo): a host that has run this
  # vLLM before keeps the kernels its V2 runner JIT-compiles on a machine's first start
  # (run 16: 101 s after graph capture on the first start, 9 s on later ones); the lent
  # machine starts bare, so a run that measures such a host carries them and says so
  if [ -n "${JIT_CACHE:-}" ]; then
    tar xzf "$REPO/$JIT_CACHE" -C ~ && echo "jit cache: $JIT_CACHE, $(find ~/.triton -type f | wc -l) files"
  fi
  echo "SEARCH_ARGS='${SEARCH_ARGS:---trials 8 --time-budget 20}'; CROSSCHECK=${CROSSCHECK:-1}; REPO=$REPO" > $Q/chain.sh
  echo "XARGS='${XARGS:---at confirmed --scale 2}'" >> $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-vllm/bin/python
s=$(date +%s)
# issue 27's command, as a user types it (--time-budget 20 so that it fits one lease)
$PY -m qtune search --model examples/qwen3-4b --input-len 1024 --output-len 256 \
  --objective capacity --slo 'ttft_p99<=500ms,tpot_p99<=20ms' --rate 16 --requests 400 \
  --warmup 160 --seed 7 $SEARCH_ARGS \
  --storage journal:///tmp/qt/study.log --study h200-trialcost --out $Q/h200-trialcost.yaml \
  --json > $Q/search.json 2> $Q/search.err
echo "search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
# where a fresh machine's one-time first-start costs (kernel JIT) are kept; the
# Triton cache (vLLM 0.26's V2 runner JIT-compiles its kernels on a first start: 118 s
# in run 15) is kept for a later session to carry, as a host that has run vLLM has it
du -sh ~/.cache/* ~/.triton /tmp/qrepo/studies/*/cache* >> $Q/chain.log 2>&1
# FlashInfer's JIT (its sampling kernels, ~/.cache/flashinfer) is the other half: run 17b
# carried ~/.triton alone and its first start still spent engine init 156 s
tar czf /tmp/jit-cache.tgz -C ~ .triton .cache/flashinfer 2>/dev/null; ls -la /tmp/jit-cache.tgz >> $Q/chain.log 2>&1
for f in systemd compose kubernetes; do
  $PY -m qtune emit $Q/h200-trialcost.yaml --format $f -o $Q/emit-$f > $Q/emit-$f.out 2>&1
  echo "emit $f rc=$?" >> $Q/chain.log
done
$PY -m qtune report h200-trialcost --storage journal:///tmp/qt/study.log --html $Q/report.html \
  --csv $Q/trials.csv > $Q/report.txt 2>&1
echo "report rc=$?" >> $Q/chain.log
if [ "$CROSSCHECK" = 1 ]; then
  cp -r $REPO/benchmarks /tmp/qrepo/  # the scripts as of the latest call
  s=$(date +%s)
  $PY benchmarks/gpu-h200/recipes/engines_crosscheck.py /tmp/qt/study.log \
    --which winner,defaults --profile $Q/h200-trialcost.yaml --slo ttft_p99=500,tpot_p99=20 $XARGS \
    --json $Q/crosscheck.json > $Q/crosscheck.log 2>&1
  echo "crosscheck rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
fi
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
for f in h200-trialcost.yaml search.json crosscheck.json report.txt; do
  [ -f $Q/$f ] && cp $Q/$f $OUT/; done
[ -f /tmp/jit-cache.tgz ] && cp /tmp/jit-cache.tgz $OUT/
cat $Q/search.err $Q/emit-*.out $Q/chain.out $Q/crosscheck.log 2>/dev/null > $OUT/console.txt
tar czf $OUT/run.tgz -C /tmp/qrepo studies -C $Q --exclude='./*.jsonl' . 2>/dev/null
tail -c 3500 $Q/search.err 2>/dev/null; tail -c 1500 $Q/crosscheck.log 2>/dev/null
