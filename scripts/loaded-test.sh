#!/usr/bin/env bash
# `make test` on a loaded machine: two processes spin on both cores while the suite
# runs three times in a row. The tests must not depend on an idle machine.
#   usage: scripts/loaded-test.sh [runs]
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
logs=$(mktemp -d)
for _ in 1 2; do python3 -c 'while True: pass' & done
trap 'kill $(jobs -p) 2>/dev/null' EXIT
failed=0
for run in $(seq "$runs"); do
  start=$(date +%s)
  if make test > "$logs/run-$run.log" 2>&1; then result=pass; else result=FAIL; failed=1; fi
  echo "run $run: $result in $(( $(date +%s) - start )) s: $(tail -1 "$logs/run-$run.log")"
done
echo "logs: $logs"
exit $failed
