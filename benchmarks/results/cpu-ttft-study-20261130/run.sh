cd /tmp/vclone
export PYTHONPATH=/tmp/vclone
P=/work/main/.venv/bin/python
s=$(date +%s)
$P -m qtune search --objective ttft_p50 --trials 6 --time-budget 16 --study ttft-study \
  --out profiles/ttft-study.yaml --json > /tmp/vstudy-search.json 2> /tmp/vstudy-search.err
echo "search rc=$? wall_s=$(( $(date +%s)-s ))" >> /tmp/vstudy.log
s=$(date +%s)
$P -m qtune verify profiles/ttft-study.yaml --repeat 3 --json > /tmp/vstudy-verify.json 2> /tmp/vstudy-verify.err
echo "verify rc=$? wall_s=$(( $(date +%s)-s ))" >> /tmp/vstudy.log
touch /tmp/vstudy.DONE
