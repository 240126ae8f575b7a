#!/bin/bash
# Interleaved A/B of vLLM CPU thread binding on this host (2 vCPUs, one NUMA node).
# Run from the worktree root under `flock -x /tmp/qtune-cpu.lock`.
# Each variant: a fresh server start (benchmarks/serve.py, qtune's launch), then one
# `qtune bench` run: concurrency 16, 256 in / 64 out, 300 requests + 16 warm-up.
set -u
PY=/work/main/.venv/bin/python
OUT=benchmarks/results/cpu-binding-20261201
declare -A P
P[auto]='{"VLLM_CPU_KVCACHE_SPACE": 4}'
P[auto-res0]='{"VLLM_CPU_KVCACHE_SPACE": 4, "VLLM_CPU_NUM_OF_RESERVED_CPU": 0}'
P[nobind]='{"VLLM_CPU_KVCACHE_SPACE": 4, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}'
i=0
for v in auto auto-res0 nobind nobind auto-res0 auto; do
  i=$((i+1))
  info=$(mktemp -u /tmp/qtune-cpubind-XXXX.json)
  $PY benchmarks/serve.py --params "${P[$v]}" --info "$info" > "$OUT/$i-$v.serve.log" 2>&1 &
  sp=$!
  for _ in $(seq 300); do [ -s "$info" ] && break; kill -0 $sp 2>/dev/null || break; sleep 1; done
  if [ -s "$info" ]; then
    url=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['url'])" "$info")
    cp "$info" "$OUT/$i-$v.server.json"
    $PY -m qtune bench --url "$url" --concurrency 16 --input-len 256 --output-len 64 \
      --requests 300 --warmup 16 --seed $i --json > "$OUT/$i-$v.bench.json" 2> "$OUT/$i-$v.bench.err"
  fi
  kill -TERM $sp; wait $sp
  rm -f "$info"
  slog=$(sed -n 's/.* log \(.*server\.log\)$/\1/p' "$OUT/$i-$v.serve.log" | head -1)
  [ -n "$slog" ] && grep -A6 "OpenMP thread binding" "$slog" > "$OUT/$i-$v.binding.txt"
done
