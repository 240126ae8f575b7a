#!/bin/bash
# Runs on the device machine from the repo copy (issue 13: capacity you can bet on).
#   capacity_run.sh copy N   copy the carried wheel part .gpuwheels/pN to /tmp/wh
#   capacity_run.sh start    copy the last part ($LAST, 7), join, install into /tmp/site,
#                            then run benchmarks/capacity_crosscheck.py for each config in
#                            $CONFIGS (JSON launch params, ';'-separated; {} = engine
#                            defaults) in the background (setsid), and wait
#   capacity_run.sh wait     wait for the chain; copy what exists into $OUT
set -u
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
  echo "CONFIGS='${CONFIGS:-{\}}'; ARGS='${ARGS:-}'" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; i=0
IFS=';' read -ra CFG <<< "$CONFIGS"
for c in "${CFG[@]}"; do
  s=$(date +%s)
  python3 benchmarks/capacity_crosscheck.py --model examples/qwen3-4b --input-len 1024 \
    --output-len 256 --rate 16 --requests 400 --warmup 160 \
    --slo 'ttft_p99<=1000ms,tpot_p99<=30ms' --params "$c" $ARGS \
    --json $Q/capacity-$i.json > $Q/capacity-$i.log 2>&1
  echo "config $i ($c) rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
  i=$((i+1))
done
touch $Q/DONE
EOC
  setsid nohup bash $Q/chain.sh > $Q/chain.out 2>&1 < /dev/null &
  ;;
esac
LIMIT=${LIMIT:-570}
while [ ! -f $Q/DONE ] && [ $(( $(date +%s)-T_CALL )) -lt $LIMIT ]; do sleep 5; done
echo "elapsed since start: $(( $(date +%s)-$(cat $Q/t0) ))s; done=$([ -f $Q/DONE ] && echo yes || echo no)"
cat $Q/chain.log 2>/dev/null
for f in $Q/capacity-*.json $Q/capacity-*.log; do [ -f "$f" ] && cp "$f" $OUT/; done
tail -c 3000 $(ls -t $Q/capacity-*.log 2>/dev/null | head -1) 2>/dev/null
