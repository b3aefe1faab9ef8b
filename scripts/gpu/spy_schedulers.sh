#!/usr/bin/env bash
# Sample every SGLang scheduler process that starts from now on with py-spy (250 Hz,
# idle samples included, so a wait for the GPU shows where the host waits; not
# blocking, so the process is not paused to be read). Each scheduler leaves
# DIR/spy-<pid>.txt (raw collapsed stacks, written when the server exits) and
# DIR/spy-<pid>.cmd (its server's command line: which contender it was).
#
#   bash scripts/gpu/spy_schedulers.sh DIR    # runs until killed
set -uo pipefail
DIR=${1:?output directory}
mkdir -p "$DIR"
while true; do
  for pid in $(pgrep -f 'sglang::scheduler' || true); do
    [[ -e $DIR/spy-$pid.cmd ]] && continue
    ps -o args= -p "$(ps -o ppid= -p "$pid" | tr -d ' ')" > "$DIR/spy-$pid.cmd" || true
    py-spy record --pid "$pid" --duration 3600 --rate 250 --format raw --idle --nonblocking \
      -o "$DIR/spy-$pid.txt" >/dev/null 2>&1 &
  done
  sleep 1
done
