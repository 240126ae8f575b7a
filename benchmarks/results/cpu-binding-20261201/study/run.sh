cd /tmp/cpustudy && date && /work/main/.venv/bin/python -m qtune search --trials 4 --space space.yaml \
  --concurrency 8 --requests 120 --warmup 16 --input-len 128 --output-len 32 --confirm-top 0 \
  --study cpubind --storage journal:///tmp/cpustudy/cpubind.log --out /tmp/cpustudy/cpubind.yaml --json \
  > search.json 2> search.err; echo rc=$? >> search.err; date
