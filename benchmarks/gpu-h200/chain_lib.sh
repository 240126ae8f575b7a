# Sourced by the device scripts (device_run.sh, capacity_run.sh, sglang_run.sh): the chain
# they write to $Q/chain.sh runs in its own session (setsid), so it outlives the call that
# started it; each call then waits for it up to $LIMIT seconds (a call may run 600 s).
start_chain() {
  setsid nohup bash $Q/chain.sh > $Q/chain.out 2>&1 < /dev/null &
}
wait_chain() {
  local limit=${LIMIT:-570}
  while [ ! -f $Q/DONE ] && [ $(( $(date +%s)-T_CALL )) -lt $limit ]; do sleep 5; done
  echo "elapsed since start: $(( $(date +%s)-$(cat $Q/t0) ))s; done=$([ -f $Q/DONE ] && echo yes || echo no)"
  cat $Q/chain.log 2>/dev/null
}
