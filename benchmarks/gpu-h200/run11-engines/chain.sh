SEARCH_ARGS='--trials 2 --time-budget 24'; CROSSCHECK=1; REPO=/work/main
cd /tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-sglang/bin/python
s=$(date +%s)
$PY -m qtune search --engine vllm,sglang \
  --engine-python vllm=/tmp/venv-vllm/bin/python,sglang=/tmp/venv-sglang/bin/python \
  --model examples/qwen3-4b --input-len 1024 --output-len 256 \
  --objective capacity --slo 'ttft_p99<=1000ms,tpot_p99<=30ms' --rate 20 --requests 400 \
  --warmup 160 --seed 1 $SEARCH_ARGS --confirm-top 0 \
  --storage journal:///tmp/qt/eng.log --study h200-engines --out $Q/h200-engines.yaml \
  --json > $Q/search.json 2> $Q/search.err
echo "search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
for f in systemd compose kubernetes; do
  $PY -m qtune emit $Q/h200-engines.yaml --format $f -o $Q/emit-$f > $Q/emit-$f.out 2>&1
  echo "emit $f rc=$?" >> $Q/chain.log
done
$PY -m qtune report h200-engines --storage journal:///tmp/qt/eng.log --html $Q/report.html \
  --csv $Q/trials.csv > $Q/report.txt 2>&1
echo "report rc=$?" >> $Q/chain.log
if [ "$CROSSCHECK" = 1 ]; then
  # the scripts as of the latest call (each call re-syncs $REPO): a fix made while the
  # study ran still reaches the cross-check
  cp -r $REPO/benchmarks /tmp/qrepo/
  s=$(date +%s)
  $PY benchmarks/gpu-h200/engines_crosscheck.py /tmp/qt/eng.log --json $Q/crosscheck.json \
    > $Q/crosscheck.log 2>&1
  echo "crosscheck rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
fi
touch $Q/DONE
