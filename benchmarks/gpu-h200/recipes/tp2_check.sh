#!/bin/bash
# Device-side check: does TP 2 start on the shared 2xH200 host (which forbids
# NVLink multicast) with the all-reduce qtune picks there, and what does it serve?
# MODE=trtllm: FlashInfer's trtllm backend only (run 5: hung after choosing it);
# MODE=fusion-off (default): also the fused all-reduce pass off, as qtune now does.
# Needs /tmp/site (vLLM) and /tmp/qrepo from device_run.sh start on a warm machine.
export PYTHONPATH=/tmp/site:/tmp/qrepo VLLM_NO_USAGE_STATS=1 VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
EXTRA=()
[ "${MODE:-fusion-off}" = fusion-off ] && EXTRA=(--compilation-config '{"pass_config":{"fuse_allreduce_rms":false}}')
cd /tmp/qrepo
TOK=$(python3 -c 'from qtune.model import generated_tokenizer; print(generated_tokenizer(151936))')
setsid python3 -m vllm.entrypoints.openai.api_server --model examples/qwen3-4b --load-format dummy --tokenizer $TOK \
  --tensor-parallel-size 2 "${EXTRA[@]}" --port 8311 > $OUT/tp2.log 2>&1 < /dev/null &
pid=$!; t=$(date +%s)
until curl -sf localhost:8311/v1/models >/dev/null; do
  sleep 2; kill -0 $pid 2>/dev/null || { echo "server died after $(( $(date +%s)-t ))s"; tail -5 $OUT/tp2.log; exit 1; }
  [ $(( $(date +%s)-t )) -gt ${LIMIT:-250} ] && { echo "not ready in ${LIMIT:-250}s"; kill -- -$pid; tail -5 $OUT/tp2.log; exit 1; }
done
echo "ready in $(( $(date +%s)-t ))s"
python3 -m qtune bench --url http://localhost:8311 --tokenizer $TOK --rate 40 --input-len 1024 \
  --output-len 256 --requests 800 --warmup 160 --seed 1 --json > $OUT/tp2-bench.json 2> $OUT/tp2-bench.err
echo "bench rc=$?"; kill -- -$pid; sleep 3
grep -E "allreduce|all-reduce|backend" $OUT/tp2.log | head -5
python3 -c "import json;d=json.load(open('$OUT/tp2-bench.json'));print({k:d.get(k) for k in list(d)[:12]})" 2>&1 | tail -3
