# Sourced by the device scripts (device_run.sh, capacity_run.sh, sglang_run.sh,
# engines_run.sh).  The chain they write to $Q/chain.sh runs in its own session (setsid),
# so it outlives the call that started it; each call then waits for it up to $LIMIT
# seconds (a call may run 600 s).
start_chain() {
  setsid nohup bash $Q/chain.sh > $Q/chain.out 2>&1 < /dev/null &
}
wait_chain() {
  local limit=${LIMIT:-570}
  while [ ! -f $Q/DONE ] && [ $(( $(date +%s)-T_CALL )) -lt $limit ]; do sleep 5; done
  echo "elapsed since start: $(( $(date +%s)-$(cat $Q/t0) ))s; done=$([ -f $Q/DONE ] && echo yes || echo no)"
  cat $Q/chain.log 2>/dev/null
}
# join_parts DIR SHA: the carried parts copied into DIR (part.NN), joined in order,
# checked against SHA (a sha256sum line for all.tar) and unpacked in DIR; exit 3 if not.
join_parts() {
  (cd $1 && cat $(ls part.* | sort -t. -k2 -n) > all.tar && sha256sum -c $2 && tar xf all.tar \
    && rm -f part.* all.tar) || exit 3
}
# put_back_flash_ops DIR SITE: sgl_kernel's FA3 library (1.1 GB, 383 MB in its wheel)
# travels xz-compressed (148 MB) as DIR/flash_ops.xz; back into the install in SITE.
put_back_flash_ops() {
  xz -dc $1/flash_ops.xz > $2/sgl_kernel/flash_ops.abi3.so || exit 3
}
