#!/bin/bash
# vLLM against SGLang on the lent H200 (issue 16, items 3-4): runs on the device machine
# from the repo copy.  Usage:
#   engines_run.sh copy v N    copy the carried vLLM part .vwheels/pN to /tmp/wh/v
#   engines_run.sh copy sg N   copy the carried SGLang part .sgwheels/pN to /tmp/wh/sg
#                              (parts of 40 MiB: the repo, ~22 MiB, and one part must stay
#                              under the 64 MiB a call carries)
#   engines_run.sh start       copy the last SGLang part (.sgwheels/p$LAST_SG, 8; carry both
#                              all.sha files with it), join and check both sets, install
#                              each into its own venv, then run in
#                              the background (setsid) the study across both engines, emit,
#                              and each engine's best measured again by its own client; wait
#   engines_run.sh wait        wait for the background chain
# vLLM 0.26.0 and SGLang 0.5.17 cannot share one environment (SGLang pins transformers
# 5.12.1, tokenizers 0.22.2), so each gets a venv of its own that sees the image's torch
# 2.11 after its own packages (a site.addsitedir .pth line), and qtune takes each engine
# from its Python: --engine-python vllm=...,sglang=....  No PYTHONPATH anywhere.
# pack_vllm_parts.sh builds .vwheels/: the vLLM set is wheels plus vLLM's own wheel
# unpacked and xz-compressed (304 MB as a wheel, 214 MB as .tar.xz: two fewer copy calls);
# the SGLang set is sglang_run.sh's.  Run 11 (RESULTS.md): 16 copies ~190 s, install 34 s.
# The study's flags come from $SEARCH_ARGS (default --trials 2: the two engines' defaults;
# a capacity trial takes 7-9.5 min on the GPU); CROSSCHECK=0 skips the engines' clients.
set -u
. "$(dirname "$0")/chain_lib.sh"
export PYTHONUNBUFFERED=1 DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1 SGLANG_DISABLE_REQUEST_LOGGING=1
unset PYTHONPATH
Q=/tmp/qt; mkdir -p $Q /tmp/wh/v /tmp/wh/sg
T_CALL=$(date +%s)
case "$1" in
copy)
  src=.vwheels; [ "$2" = sg ] && src=.sgwheels
  cp $src/p$3/* /tmp/wh/$2/ && ls /tmp/wh/$2 | tr '\n' ' ' && nvidia-smi -L; exit 0 ;;
start)
  copy_repo
  cp .sgwheels/p${LAST_SG:-8}/* /tmp/wh/sg/ || exit 3
  t=$(date +%s)
  for e in v sg; do
    src=$REPO/.vwheels; [ $e = sg ] && src=$REPO/.sgwheels
    join_parts /tmp/wh/$e $src/all.sha; cd /tmp/wh/$e
    venv=/tmp/venv-$e; [ $e = v ] && venv=/tmp/venv-vllm; [ $e = sg ] && venv=/tmp/venv-sglang
    image_venv $venv
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SP \
      /tmp/wh/$e/w/*.whl 2>&1 | tail -3
    [ -f vllm-tree.tar.xz ] && xz -dc vllm-tree.tar.xz | tar xf - -C $SP
    [ -f flash_ops.xz ] && put_back_flash_ops /tmp/wh/$e $SP
  done
  echo "install_s=$(( $(date +%s)-t )) image site $IMAGE_SITE"
  cd /tmp/qrepo
  for m in vllm sglang; do
    /tmp/venv-$m/bin/python -c "import $m, torch, transformers; print('$m', $m.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | grep -v -i warn | tail -2
  done
  /tmp/venv-sglang/bin/python -c "import optuna, typer, qtune.cli; print('qtune ok')" 2>&1 | tail -1
  echo "SEARCH_ARGS='${SEARCH_ARGS:---trials 2 --time-budget 24}'; CROSSCHECK=${CROSSCHECK:-1}; REPO=$REPO" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
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
  $PY benchmarks/gpu-h200/recipes/engines_crosscheck.py /tmp/qt/eng.log --json $Q/crosscheck.json \
    > $Q/crosscheck.log 2>&1
  echo "crosscheck rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
fi
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
for f in h200-engines.yaml search.json crosscheck.json crosscheck.log report.txt report.html trials.csv; do
  [ -f $Q/$f ] && cp $Q/$f $OUT/; done
cat $Q/search.err $Q/emit-*.out $Q/chain.out 2>/dev/null > $OUT/console.txt
tar czf $OUT/logs.tgz -C /tmp/qrepo studies -C $Q --exclude=./h200-engines.yaml \
  --exclude='./*.jsonl' . 2>/dev/null
tail -c 3000 $Q/search.err 2>/dev/null; tail -c 1500 $Q/crosscheck.log 2>/dev/null
