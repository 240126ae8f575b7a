#!/bin/bash
# Runs on the device machine from the repo copy. Usage: device_run.sh start|wait
# start: join the carried wheel parts, install into /tmp/site, probe, then run the
#        study -> emit -> verify chain in the background (setsid), and wait.
# wait:  wait for the background chain; both modes copy what exists into $OUT.
set -u
REPO=$PWD
export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONPATH=/tmp/site:$REPO
Q=/tmp/qt; mkdir -p $Q
T_CALL=$(date +%s)
if [ "$1" = start ]; then
  date +%s > $Q/t0
  cp .gpuwheels/p6/* /tmp/wh/ && cd /tmp/wh && cat part.0 part.1 part.2 part.3 part.4 part.5 > all.tar \
    && sha256sum all.tar && mkdir -p w && tar xf all.tar -C w && rm -f part.* all.tar || exit 3
  t=$(date +%s); python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site /tmp/wh/w/*.whl 2>&1 | tail -5; echo "install_s=$(( $(date +%s)-t ))"
  cd $REPO
  python3 -c "import vllm, optuna, typer, qtune.cli; print('vllm', vllm.__version__, 'optuna', optuna.__version__, 'typer', typer.__version__)" 2>&1 | tail -3
  python3 -m qtune probe --json > $Q/probe.json 2> $Q/probe.err; echo "probe json rc=$?"
  python3 -m qtune probe > $Q/probe.txt 2>&1; echo "probe rc=$?"
  cat > $Q/chain.sh <<'EOC'
cd "$1"; Q=/tmp/qt
s=$(date +%s)
python3 -m qtune search --model examples/qwen3-4b --input-len 1024 --output-len 256 --rate 40 \
  --requests 400 --warmup 80 --seed 1 --trials 10 --time-budget 11 \
  --storage journal:///tmp/qt/h200.log --study h200-qwen3-4b --out $Q/h200-qwen3-4b.yaml \
  --json > $Q/search.json 2> $Q/search.err
echo "search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
python3 -m qtune emit $Q/h200-qwen3-4b.yaml --format systemd -o $Q/h200-qwen3-4b.service > $Q/emit.out 2>&1
echo "emit rc=$?" >> $Q/chain.log
el=$(( $(date +%s)-$(cat $Q/t0) ))
if [ -f $Q/h200-qwen3-4b.yaml ] && [ $el -lt 1150 ]; then
  s=$(date +%s)
  python3 -m qtune verify $Q/h200-qwen3-4b.yaml --repeat 1 --json > $Q/verify.json 2> $Q/verify.err
  echo "verify rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
else
  echo "verify skipped: elapsed ${el}s" >> $Q/chain.log
fi
touch $Q/DONE
EOC
  setsid nohup bash $Q/chain.sh $REPO > $Q/chain.out 2>&1 < /dev/null &
fi
LIMIT=${LIMIT:-560}
while [ ! -f $Q/DONE ] && [ $(( $(date +%s)-T_CALL )) -lt $LIMIT ]; do sleep 5; done
echo "elapsed since start: $(( $(date +%s)-$(cat $Q/t0) ))s; done=$([ -f $Q/DONE ] && echo yes || echo no)"
cat $Q/chain.log 2>/dev/null
for f in probe.json probe.txt h200-qwen3-4b.yaml h200-qwen3-4b.service search.json verify.json; do
  [ -f $Q/$f ] && cp $Q/$f $OUT/; done
cat $Q/probe.err $Q/search.err $Q/emit.out $Q/verify.err $Q/chain.out 2>/dev/null > $OUT/console.txt
tar czf $OUT/logs.tgz -C $REPO studies -C $Q h200.log chain.log 2>/dev/null
tail -c 3000 $Q/search.err 2>/dev/null
ls -la $OUT
