#!/bin/bash
# Builds .vwheels/ for engines_run.sh and trialcost_run.sh on this machine: vLLM 0.26.0's
# wheel set (../shared/gpu/vllm-0.26.0-cu13-py312-wheels.txt) and any further lists given
# (recipes/qtune_wheels.txt: qtune's own dependencies the image lacks), with vLLM's own wheel
# unpacked and xz-compressed (304 MB as a wheel, 214 MB as .tar.xz, ~2.5 min of xz on 2
# cores), tarred and split into parts of $PART (38M: the repo, ~24 MiB, and one part must
# stay under the 64 MiB a call carries), one folder each (a call carries one folder), with
# all.sha beside them.  The SGLang parts (.sgwheels/) are sglang_run.sh's.
#   bash benchmarks/gpu-h200/recipes/pack_vllm_parts.sh [LIST ...]
set -eu
[ $# -gt 0 ] || set -- ../shared/gpu/vllm-0.26.0-cu13-py312-wheels.txt
W=$(mktemp -d); trap 'rm -rf $W' EXIT
mkdir -p $W/wh $W/pack/w $W/u
cat "$@" | grep -v '^#' | grep -v '^$' > $W/req.txt
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any -d $W/wh -r $W/req.txt
(cd $W/u && unzip -q $W/wh/vllm-*.whl && tar cf - . | xz -T2 -6 > $W/pack/vllm-tree.tar.xz)
cp $W/wh/*.whl $W/pack/w/ && rm $W/pack/w/vllm-*.whl
(cd $W/pack && tar cf all.tar w vllm-tree.tar.xz && sha256sum all.tar > all.sha)
rm -rf .vwheels && mkdir .vwheels && split -b ${PART:-38M} -d -a 2 $W/pack/all.tar .vwheels/part.
for f in .vwheels/part.*; do n=$((10#${f##*.})); mkdir .vwheels/p$n && mv $f .vwheels/p$n/; done
cp $W/pack/all.sha .vwheels/ && ls .vwheels
# .qwheels: qtune's CLI stack (recipes/qtune_cli_wheels.txt), carried with the last part
rm -rf .qwheels && .venv/bin/python -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform any -d .qwheels \
  -r "$(dirname "$0")/qtune_cli_wheels.txt" && ls .qwheels
