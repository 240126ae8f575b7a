#!/bin/bash
# Runs on the device machine from the repo copy (issue 13: capacity you can bet on).
#   capacity_run.sh copy N   copy the carried wheel part .gpuwheels/pN to /tmp/wh
#   capacity_run.sh start    copy the last part ($LAST, 7), join, install into /tmp/site,
#                            then in the background (setsid), for each config in $CONFIGS
#                            (JSON launch params, ';'-separated; {} = engine defaults):
#                            start ONE server (benchmarks/serve.py), run
#                            benchmarks/server_view_ab.py on it when $AB_ARMS is set
#                            (qtune's view on/off against `vllm bench serve`, interleaved,
#                            at $AB_RATE), then benchmarks/capacity_crosscheck.py unless
#                            CAPACITY=0; and wait
#   STUDY=1 capacity_run.sh start   instead: `qtune search --objective capacity` ($SEARCH_ARGS,
#                            space file $SPACE), then ONE server with the winner's params and
#                            capacity_crosscheck.py --at <its capacity> over twice its longest probe
#   capacity_run.sh wait     wait for the chain; copy what exists into $OUT
set -u
. "$(dirname "$0")/chain_lib.sh"
export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONPATH=/tmp/site:/tmp/qrepo
Q=/tmp/qt; mkdir -p $Q /tmp/wh
T_CALL=$(date +%s)
case "$1" in
copy)
  cp .gpuwheels/p$2/* /tmp/wh/ && ls /tmp/wh; exit 0 ;;
start)
  date +%s > $Q/t0
  rm -rf /tmp/qrepo && mkdir -p /tmp/qrepo && cp -r qtune examples benchmarks pyproject.toml /tmp/qrepo/
  cp .gpuwheels/p${LAST:-7}/* /tmp/wh/ && cd /tmp/wh && cat $(ls part.* | sort -t. -k2 -n) \
    > all.tar && sha256sum all.tar | cut -c1-16 && mkdir -p w && tar xf all.tar -C w && rm -f part.* all.tar || exit 3
  t=$(date +%s); python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site /tmp/wh/w/*.whl 2>&1 | tail -3; echo "install_s=$(( $(date +%s)-t ))"
  cd /tmp/qrepo
  python3 -c "import vllm, optuna, qtune.cli; print('vllm', vllm.__version__)" 2>&1 | tail -1
  nvidia-smi -L
  if [ "${STUDY:-0}" = 1 ]; then
  echo "SEARCH_ARGS='${SEARCH_ARGS:---trials 3 --time-budget 17}'; SPACE='${SPACE:-}'" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; s=$(date +%s)
python3 -m qtune search --model examples/qwen3-4b --input-len 1024 --output-len 256 \
  --objective capacity --slo 'ttft_p99<=1000ms,tpot_p99<=30ms' --rate 20 --requests 400 \
  --warmup 160 --seed 1 ${SPACE:+--space $SPACE} $SEARCH_ARGS --confirm-top 0 \
  --storage journal:///tmp/qt/cap.log --study h200-capacity --out $Q/h200-capacity.yaml \
  --json > $Q/search.json 2> $Q/search.err
echo "search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
python3 benchmarks/gpu-h200/recipes/winner.py $Q/h200-capacity.yaml /tmp/qt/cap.log > $Q/winner.env \
  2>> $Q/chain.log || { touch $Q/DONE; exit 0; }
. $Q/winner.env; echo "winner: $PARAMS at $RATE req/s, $N requests" >> $Q/chain.log
s=$(date +%s); rm -f $Q/server.json
python3 benchmarks/serve.py --model examples/qwen3-4b --params "$PARAMS" --info $Q/server.json \
  > $Q/server-w.log 2>&1 &
SP=$!
while [ ! -f $Q/server.json ] && kill -0 $SP 2>/dev/null; do sleep 2; done
if [ -f $Q/server.json ]; then
  read URL SM TOK < <(python3 -c "import json; d=json.load(open('$Q/server.json')); print(d['url'], d['model'], d['tokenizer'])")
  echo "winner server ready after $(( $(date +%s)-s ))s" >> $Q/chain.log
  python3 benchmarks/capacity_crosscheck.py --url $URL --served-model $SM --tokenizer $TOK \
    --input-len 1024 --output-len 256 --warmup 160 --slo 'ttft_p99<=1000ms,tpot_p99<=30ms' \
    --params "$PARAMS" --at $RATE --at-requests $N --json $Q/capacity-w.json > $Q/capacity-w.log 2>&1
  echo "cross-check rc=$? at $(( $(date +%s)-s ))s" >> $Q/chain.log
else
  echo "winner server did not start" >> $Q/chain.log
fi
kill $SP 2>/dev/null; wait $SP
touch $Q/DONE
EOC
  else
  echo "CONFIGS='${CONFIGS:-{\}}'; ARGS='${ARGS:-}'; AB_ARMS='${AB_ARMS:-}'; AB_RATE=${AB_RATE:-40}; AB_REQUESTS=${AB_REQUESTS:-800}; AB_ROUNDS=${AB_ROUNDS:-3}; CAPACITY=${CAPACITY:-1}; CAP_RATE=${CAP_RATE:-16}" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; i=0
IFS=';' read -ra CFG <<< "$CONFIGS"
for c in "${CFG[@]}"; do
  s=$(date +%s); rm -f $Q/server.json
  python3 benchmarks/serve.py --model examples/qwen3-4b --params "$c" --info $Q/server.json \
    > $Q/server-$i.log 2>&1 &
  SP=$!
  while [ ! -f $Q/server.json ] && kill -0 $SP 2>/dev/null; do sleep 2; done
  if [ -f $Q/server.json ]; then
    read URL SM TOK < <(python3 -c "import json; d=json.load(open('$Q/server.json')); print(d['url'], d['model'], d['tokenizer'])")
    echo "config $i ($c) ready after $(( $(date +%s)-s ))s" >> $Q/chain.log
    if [ -n "${AB_ARMS:-}" ]; then
      python3 benchmarks/server_view_ab.py --url $URL --model $SM --tokenizer $TOK \
        --rate ${AB_RATE:-40} --requests ${AB_REQUESTS:-800} --input-len 1024 --output-len 256 \
        --warmup 160 --rounds ${AB_ROUNDS:-3} --arms $AB_ARMS --json $Q/view-ab-$i.json \
        > $Q/view-ab-$i.log 2>&1
      echo "config $i view-ab rc=$? at $(( $(date +%s)-s ))s" >> $Q/chain.log
    fi
    if [ "${CAPACITY:-1}" = 1 ]; then
      python3 benchmarks/capacity_crosscheck.py --url $URL --served-model $SM --tokenizer $TOK \
        --input-len 1024 --output-len 256 --rate ${CAP_RATE:-16} --requests 400 --warmup 160 \
        --slo 'ttft_p99<=1000ms,tpot_p99<=30ms' --params "$c" $ARGS \
        --json $Q/capacity-$i.json > $Q/capacity-$i.log 2>&1
      echo "config $i capacity rc=$? at $(( $(date +%s)-s ))s" >> $Q/chain.log
    fi
  else
    echo "config $i ($c): server did not start" >> $Q/chain.log
  fi
  kill $SP 2>/dev/null; wait $SP
  echo "config $i done wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
  i=$((i+1))
done
touch $Q/DONE
EOC
  fi
  start_chain
  ;;
esac
wait_chain
for f in $Q/search.json $Q/search.err $Q/h200-capacity.yaml $Q/cap.log $Q/winner.env $Q/capacity-*.json $Q/capacity-*.log $Q/view-ab-*.json $Q/view-ab-*.log $Q/server-*.log; do [ -f "$f" ] && cp "$f" $OUT/; done
tail -c 1500 $Q/search.err 2>/dev/null
for f in $(ls -t $Q/capacity-*.log $Q/view-ab-*.log 2>/dev/null | head -2); do echo "== $f"; tail -c 2500 $f; done
