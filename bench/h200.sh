#!/usr/bin/env bash
# The H200 pipeline after the sweeps, in steps that each fit one 10-minute GPU command.
# Run from the repository root on the GPU machine; results go to $OUT (default runs/h200)
# and, for the next step on the same machine, to $STATE (default /tmp/epiforge-h200).
#
#   bench/h200.sh confirm   # re-time every row at its sweeps' 3 fastest configs, beside the final's baselines
#   bench/h200.sh final     # TUNED from sweeps + confirm; check, final, chain, final-2 (tuned.tar: the new tables)
#
# Then, here: tar xf tuned.tar; copy the JSON into bench/results/h200/; python -m bench.report ...
# Where .git did not travel, set EPIFORGE_COMMIT=<hash> so the result files name their sources.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/h200}
STATE=${STATE:-/tmp/epiforge-h200}
R=bench/results/h200
SWEEPS="$R/sweep.json $R/sweep-cs.json $R/sweep-c8.json"
PY=${PYTHON:-python3}

case "${1:-}" in
  confirm)
    mkdir -p "$OUT" "$STATE"
    # shellcheck disable=SC2086  # SWEEPS is a list of paths without spaces
    $PY -m bench.run --configs-from $SWEEPS --top 3 --compile --liger --library --out "$STATE/confirm.json"
    cp "$STATE/confirm.json" "$OUT/"
    ;;
  final)
    mkdir -p "$OUT" "$STATE"
    picks="$SWEEPS"
    if [ -f "$STATE/confirm.json" ]; then
      cp "$STATE/confirm.json" "$R/confirm.json"  # a later file's rows replace the sweeps' picks
      picks="$SWEEPS $R/confirm.json"
    fi
    # shellcheck disable=SC2086
    $PY -m bench.tuning $picks --write > "$OUT/tuning.txt"
    tar cf "$OUT/tuned.tar" human_kernels/k*.py bench/quack_library.py  # one file: the device returns few
    $PY -m bench.check_gpu --out "$OUT/check.json" | tail -2
    # shellcheck disable=SC2086
    $PY -m bench.run --tuned --sol-from $SWEEPS --compile --liger --library --diagnostics --out "$OUT/final.json" \
      | grep -E "^k[0-9] "
    # shellcheck disable=SC2086
    $PY -m bench.chain --sol-from $SWEEPS --out "$OUT/chain.json" | grep -E "^chain "
    # shellcheck disable=SC2086
    $PY -m bench.run --tuned --sol-from $SWEEPS --compile --liger --library --diagnostics --out "$OUT/final-2.json" \
      | grep -E "^k[0-9] "
    ;;
  *)
    echo "usage: bench/h200.sh confirm|final" >&2
    exit 2
    ;;
esac
