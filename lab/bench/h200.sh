#!/usr/bin/env bash
# The H200 pipeline after the sweeps, in steps that each fit one 10-minute GPU command.
# Run from the repository root on the GPU machine; results go to $OUT (default runs/h200)
# and, for the next step on the same machine, to $STATE (default /tmp/epiforge-h200).
# Each step first installs the carried precompiled objects: .epiforge/quack-cache, or the
# folder $PRECOMPILED names (install_objects below).
#
#   lab/bench/h200.sh confirm   # re-time every row at its sweeps' 3 fastest configs, beside the final's baselines
#   lab/bench/h200.sh final     # TUNED from sweeps + confirm; check, final, chain (tuned.tar: the new tables)
#   lab/bench/h200.sh rerun     # the final's command again (final-2.json): how far a rerun moves each ratio
#   lab/bench/h200.sh profile   # Nsight Compute: k7 and k0 at 1B beside their diagnostics and the plain GEMM (ncu.txt)
#   lab/bench/h200.sh profile-stalls # Nsight Compute warp-stall reasons: k7 1B/7B and k0 1B fused, fused with the C-load warp, plain GEMM (stalls.txt, stalls.json)
#   lab/bench/h200.sh profile-epilogue-stalls # Nsight Compute PC sampling per SASS instruction (objects with line info: bench.precompile --lineinfo --tasks k0 k7 --configs <the six> --parts kernels, here first): k7 1B/7B, k0 1B without and with the C-load warp (epilogue-stalls.txt; bench.epilogue_stalls reads it here)
#   lab/bench/h200.sh epi-tile       # the epilogue sub-tile twice as wide (_en64) against its twins, k0 and k7 at 1B and 7B (epi-tile.json), after its GPU bit test
#   lab/bench/h200.sh c-load-ceiling # issue 16's closing run: k0, k7, k6 at 1B and 7B, with and without the C-load warp, beside their diagnostics (floors) and quack's library, one interleaved run per row (c-load-ceiling.json; bench.ceiling's table)
#   lab/bench/h200.sh chain-cl       # issue 16: the backward chain (k7 -> k6) with k7 with and without the C-load warp, at 1B and 7B, twice (chain-cl.json, chain-cl-2.json)
#   lab/bench/h200.sh training-check # issue 15 section 3 at this commit: every training GPU test (gradients of the ops, the layer, the LLaMA and Qwen3 models against float32) and the 200-step loss curve (pytest-gpu-training.log, loss_curve_cuda.json/.png)
#   lab/bench/h200.sh sweep-llama1b-k6 # issue 15: k6's tile configs at the 1B model's LM-head and QKV input gradients (sweep-llama1b-k6.json)
#   lab/bench/h200.sh sweep-llama3   # issue 15: k0 (after the down projection, --gemm-k F), k2, k6, k7 at LLaMA-3's three layers, config set llama3 (sweep-llama3-k0-down.json, sweep-llama3.json)
#   lab/bench/h200.sh judge-check    # the expert kernels through the evaluator, numerics + launches at every shape (check.json)
#   lab/bench/h200.sh judge-tests    # the evaluator's GPU tests (tests/eval -m gpu): timed stages, faults, plausibility
#   lab/bench/h200.sh judge-exploits # the exploit suite on the GPU (SHARDS processes), the tolerance margins beside it (judge-margins)
#   lab/bench/h200.sh judge-margins  # every expert kernel's tolerance margins (max, RMS, element) in every precision at the
#                                # smoke, heads, coda and paper shapes (margins-<gpu>-<set>.json; MARGINS_RESUME=DIR takes
#                                # up the files of a cut-short call from DIR), within MARGINS_BUDGET_S seconds
#   lab/bench/h200.sh judge-compare  # epiforge compare of each task at the paper shapes (compare.md, compare.sqlite)
#   lab/bench/h200.sh judge-compare-all  # epiforge compare --all at the paper shapes, as one command, its wall time kept
#   lab/bench/h200.sh judge-lead     # compare of k0 and k8 under each timed lead (LEADS), bench.run before and after (lead-study.md)
#   lab/bench/h200.sh judge-noise    # bench, compare under each of NOISE_LEADS (LEAD or LEAD@REPS) for NOISE_ROUNDS rounds, bench, of the same tasks: compare's run-to-run noise beside bench's (noise.md)
#   lab/bench/h200.sh quack-upstream # the C-load warp patch's quack-side test on a patched copy of quack (SHARDS processes)
#   lab/bench/h200.sh judge-launcher # the judge's launcher mode: its GPU test, the exploit suite's launcher cases (SHARDS processes) and every expert kernel at smoke and paper (check-launcher.json), side by side (nothing is timed)
#   lab/bench/h200.sh launcher-overhead # the expert kernels of LAUNCHER_TASKS judged in both modes, one interleaved run per paper shape (launcher-overhead.json)
#   lab/bench/h200.sh coda           # the coda baseline: its GPU test (CODA_STEP=test), or compare of the mapped tasks with it (compare-coda-<shapes>.md)
#   lab/bench/h200.sh layer          # the layer task (12 GEMMs): its expert through the evaluator at smoke and paper (check-layer.json), then compare at the paper shapes (compare-layer.md)
#
# Each GPU call gets a fresh copy of the working tree: before `rerun` in a later call, unpack
# the final's tuned.tar here so that the rerun times the same TUNED tables.
#
# Then, here: tar xf tuned.tar; copy the JSON into lab/results/h200/; python -m lab.bench.report ...
# Where .git did not travel, set EPIFORGE_COMMIT=<hash> so the result files name their sources.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/h200}
STATE=${STATE:-/tmp/epiforge-h200}
R=lab/results/h200
SWEEPS="$R/sweep.json $R/sweep-cs.json $R/sweep-c8.json"
PY=${PYTHON:-python3}
# the carried precompiled objects (bench.precompile) into this machine's quack cache: from
# $PRECOMPILED where set (a smaller folder built with --cache-dir, to fit a call's carry), else
# from the default folder (eval.precompiled.CACHE_DIR)
install_objects() {
  $PY -c "import sys; from pathlib import Path; from epiforge.eval.precompiled import CACHE_DIR, install_precompiled as i
src = Path(sys.argv[1]) if sys.argv[1] else CACHE_DIR
print(i(src), 'precompiled objects installed from', src.name)" "${PRECOMPILED:-}"
}
# the first line of a log: "environment: " and the machine's fingerprint (GPU, driver,
# versions, date, command, commit; EPIFORGE_COMMIT where the machine has no .git)
fingerprint_line() {
  $PY -c 'import json, sys; from epiforge.eval.machine import fingerprint; print("environment: " + json.dumps(fingerprint("cuda", sys.argv[1])))' "$1"
}
# the exploit suite's GPU cases (those matching pytest -k $1, all if empty) in SHARDS pytest
# processes side by side, each shard's output in one log, $2, headed by the fingerprint of
# the command $3; $4: each shard's time limit
exploit_shards() {
  local k=(); [ -n "$1" ] && k=(-k "$1")
  $PY -m pytest -m gpu tests/exploits "${k[@]}" --collect-only -q -p no:cacheprovider | grep "::" > "$STATE/exploit-ids"
  rm -f "$STATE"/shard.*
  split -n "r/${SHARDS:-4}" "$STATE/exploit-ids" "$STATE/shard."
  for s in "$STATE"/shard.??; do
    mapfile -t ids < "$s"
    timeout "$4" $PY -m pytest -m gpu -q -p no:cacheprovider -rfEX "${ids[@]}" > "$s.log" 2>&1 &
  done
  wait
  { fingerprint_line "$3"
    for s in "$STATE"/shard.??; do echo "== $(basename "$s"): $(wc -l < "$s") cases"; cat "$s.log"; done
  } > "$2"
}
REPS=${REPS:-60}  # the final's repetitions: twice the sweeps', for the 70B rows whose clocks wander most

case "${1:-}" in
  confirm)
    mkdir -p "$OUT" "$STATE"
    # shellcheck disable=SC2086  # SWEEPS is a list of paths without spaces
    $PY -m lab.bench.run --configs-from $SWEEPS --top 3 --compile --liger --library --out "$STATE/confirm.json"
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
    $PY -m lab.bench.tuning $picks --write > "$OUT/tuning.txt"
    tar cf "$OUT/tuned.tar" human_kernels/k*.py eval/quack_library.py  # one file: the device returns few
    $PY -m lab.bench.check_gpu --out "$OUT/check.json" | tail -2
    # shellcheck disable=SC2086
    $PY -m lab.bench.run --tuned --sol-from $SWEEPS --compile --liger --library --diagnostics --reps "$REPS" \
      --out "$OUT/final.json" | grep -E "^k[0-9] "
    # shellcheck disable=SC2086
    $PY -m lab.bench.chain --sol-from $SWEEPS --reps "$REPS" --out "$OUT/chain.json" | grep -E "^chain "
    ;;
  rerun)
    mkdir -p "$OUT"
    # shellcheck disable=SC2086
    $PY -m lab.bench.run --tuned --sol-from $SWEEPS --compile --liger --library --diagnostics --reps "$REPS" \
      --out "$OUT/final-2.json" | grep -E "^k[0-9] "
    ;;
  profile)
    # Nsight Compute on k7 and k0 at 1B: each kernel beside its diagnostics and the plain
    # GEMM at the same config (DRAM traffic and throughput, time at ncu's locked clocks)
    mkdir -p "$OUT" "$STATE"
    metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
    metrics=$metrics,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
    install_objects
    for run in "k7 1B gemm" "k7 1B fused" "k7 1B stores_only" "k7 1B without_postact" \
               "k0 1B gemm" "k0 1B fused" "k0 1B stores_only"; do
      # shellcheck disable=SC2086  # run is three words
      ncu -k regex:cutlass --launch-skip 2 --launch-count 1 --metrics "$metrics" --csv \
        $PY -m lab.bench.profile_one $run > "$STATE/ncu-${run// /-}.csv" 2>&1 || true
    done
    tail -n +1 "$STATE"/ncu-*.csv | grep -E "==>|gpu__time|dram__|sm__throughput|Error|error" > "$OUT/ncu.txt"
    $PY -c "import json; from lab.bench.gpu_env import fingerprint; print(json.dumps(fingerprint('bash lab/bench/h200.sh profile')))" \
      > "$STATE/ncu-env.json"
    $PY -m lab.bench.ncu_report "$OUT/ncu.txt" --environment "$STATE/ncu-env.json" --out "$OUT/ncu.json"
    ;;
  profile-stalls)
    # issue 16: where the warps wait, before and after the C-load warp: each fused kernel at
    # its TUNED pick, the same with c_load_warp set, and the plain GEMM at that config (the
    # stalls the mainloop has anyway). Kernel-wide averages over all warps; the CSVs go into
    # one file (the device returns few files): stalls.txt, then stalls.json by ncu_report
    mkdir -p "$OUT" "$STATE/stalls"
    metrics='gpu__time_duration.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
    metrics=$metrics,smsp__average_warp_latency_per_inst_issued.ratio,smsp__warps_active.avg.per_cycle_active
    install_objects
    rm -f "$STATE"/stalls/ncu-*.csv
    for run in "k7 1B fused" "k7 1B fused --c-load-warp" "k7 1B gemm" "k7 7B fused" "k7 7B fused --c-load-warp" \
               "k7 7B gemm" "k0 1B fused" "k0 1B fused --c-load-warp" "k0 1B gemm"; do
      name=${run// --c-load-warp/-cl}
      # shellcheck disable=SC2086  # run is three or four words
      timeout 120 ncu -k regex:cutlass --launch-skip 2 --launch-count 1 --metrics "$metrics" --csv \
        $PY -m lab.bench.profile_one $run > "$STATE/stalls/ncu-${name// /-}.csv" 2>&1 || echo "$run: exit $?"
    done
    (cd "$STATE/stalls" && tail -n +1 ncu-*.csv) > "$OUT/stalls.txt"
    $PY -c "import json; from lab.bench.gpu_env import fingerprint; print(json.dumps(fingerprint('bash lab/bench/h200.sh profile-stalls')))" \
      > "$STATE/stalls/environment.json"
    $PY -m lab.bench.ncu_report "$OUT/stalls.txt" --stalls --environment "$STATE/stalls/environment.json" \
      --out "$OUT/stalls.json"
    ;;
  profile-epilogue-stalls)
    # issue 16: where the epilogue warps wait, instruction by instruction. PC sampling
    # (SourceCounters) of each kernel built with line info (precompile --lineinfo), so that
    # every sampled SASS instruction names its quack source line and the epilogue's own
    # instructions can be told apart (bench.epilogue_stalls, here). One report per run, its
    # source page as CSV, all in one file
    mkdir -p "$OUT" "$STATE/epi-stalls"
    rm -f "$STATE"/epi-stalls/*
    for run in "k7 1B 128x128_c1x2_pp_cs2" "k7 1B 128x128_c1x2_pp_cs2_cl" "k7 7B 128x128_c1x2_pp_cs1" \
               "k7 7B 128x128_c1x2_pp_cs1_cl" "k0 1B 128x128_c1x2_pp" "k0 1B 128x128_c1x2_pp_cl"; do
      read -r task scale config <<< "$run"
      name="$task-$scale-$config"
      timeout 150 ncu -k regex:cutlass --launch-skip 2 --launch-count 1 --section SourceCounters \
        --section WarpStateStats --metrics gpu__time_duration.sum -f -o "$STATE/epi-stalls/$name" \
        $PY -m lab.bench.profile_one "$task" "$scale" fused --config "$config" --lineinfo \
        > "$STATE/epi-stalls/$name.log" 2>&1 || echo "$run: ncu exit $?"
      { echo "==> $name <=="
        ncu -i "$STATE/epi-stalls/$name.ncu-rep" --page source --csv --print-source sass 2>&1 \
          || ncu -i "$STATE/epi-stalls/$name.ncu-rep" --page source --csv 2>&1 || echo "no source page"
        echo "==> $name details <=="
        ncu -i "$STATE/epi-stalls/$name.ncu-rep" --page details --csv 2>&1 | grep -iE "duration|Stall|Warp Cycles|Issued" || true
      } >> "$OUT/epilogue-stalls.txt"
      grep -E "calls|rror" "$STATE/epi-stalls/$name.log" | tail -2
    done
    fingerprint_line "bash lab/bench/h200.sh profile-epilogue-stalls" > "$OUT/epilogue-stalls-environment.txt"
    ls -la "$OUT"
    ;;
  epi-tile)
    # issue 16: fewer, wider epilogue sub-tiles (GemmConfig.epi_tile_n): the same values
    # (16-bit outputs bit for bit), then one interleaved run of every config and its twin
    mkdir -p "$OUT"
    install_objects
    { fingerprint_line "bash lab/bench/h200.sh epi-tile"
      timeout 200 $PY -m pytest -m gpu tests/primitives/test_gemm_config.py -k epi_tile -q -p no:cacheprovider -rfEX 2>&1 || true
    } > "$OUT/pytest-gpu-epi-tile.log"
    tail -2 "$OUT/pytest-gpu-epi-tile.log"
    timeout "${EPI_TILE_TIMEOUT_S:-330}" $PY -m lab.bench.run --tasks k0 k7 --scales 1B 7B --configs epi-tile \
      --reps "${EPI_TILE_REPS:-30}" --out "$OUT/epi-tile.json" > "$OUT/epi-tile.log" 2>&1 || echo "bench.run: exit $?"
    $PY -m lab.bench.tuning "$OUT/epi-tile.json" --pairs _en64 || true
    ;;
  c-load-ceiling)
    # issue 16: the targets against the floors that the diagnostics measure (lab/bench/ceiling.py);
    # precompile here first: --tasks k0 k7 k6 --configs c-load-ceiling --parts kernels library diagnostics gemm.
    # With --cache-dir .epiforge/ceiling-cache (8 MB) the objects fit in the call that carries
    # .gpu/part2 and .gpu/env: carry that folder too and set PRECOMPILED=.epiforge/ceiling-cache.
    mkdir -p "$OUT"
    install_objects
    timeout "${CEILING_TIMEOUT_S:-420}" $PY -m lab.bench.run --tasks k0 k7 k6 --scales 1B 7B --configs c-load-ceiling \
      --library --diagnostics --reps "${CEILING_REPS:-40}" --out "$OUT/c-load-ceiling.json" > "$OUT/c-load-ceiling.log" 2>&1 \
      || echo "bench.run: exit $?"
    $PY -m lab.bench.ceiling "$OUT/c-load-ceiling.json" || true
    ;;
  chain-cl)
    # issue 16 section 2: the chain before and after, in one interleaved run per scale: the
    # fused chain at the TUNED configs (k7 7B with the C-load warp, 1B without), the same
    # chain with k7 at _cs2_cl and at _cs1 (the twins), torch.compile of the unfused chain and
    # the GEMM-only bound. Every quack object it needs is in the c-load-ceiling precompile, so
    # PRECOMPILED=.epiforge/ceiling-cache serves it; run twice for the run-to-run spread.
    mkdir -p "$OUT"
    install_objects
    for run in "" -2; do
      timeout "${CHAIN_TIMEOUT_S:-240}" $PY -m lab.bench.chain --scales 1B 7B \
        --k7-configs 128x128_c1x2_pp_cs2_cl 128x128_c1x2_pp_cs1 --reps "${CHAIN_REPS:-30}" \
        --out "$OUT/chain-cl$run.json" > "$OUT/chain-cl$run.log" 2>&1 || echo "bench.chain: exit $?"
      grep -E "^chain " "$OUT/chain-cl$run.log" || true
    done
    ;;
  training-check)
    # issue 15 section 3 on the GPU, again after the model's code changed (the H200's last
    # run was at 4d850f3): the gradient tests of tests/test_training_*.py marked gpu, then
    # the loss curve against the unfused float32 model (lab/results/training-check holds the last ones)
    mkdir -p "$OUT"
    install_objects
    { fingerprint_line "python -m pytest -m gpu tests/training/test_training_ops.py tests/training/test_training_layer.py tests/training/test_training_model.py tests/training/test_training_qk_norm.py -q"
      timeout "${TRAINING_TESTS_TIMEOUT_S:-360}" $PY -m pytest -m gpu tests/training/test_training_ops.py tests/training/test_training_layer.py \
        tests/training/test_training_model.py tests/training/test_training_qk_norm.py -q -p no:cacheprovider -rfEX 2>&1 || echo "pytest: exit $?"
    } > "$OUT/pytest-gpu-training.log"
    tail -1 "$OUT/pytest-gpu-training.log"
    timeout "${LOSS_CURVE_TIMEOUT_S:-200}" $PY -m epiforge.training.loss_curve --steps 200 --device cuda --out "$OUT" \
      > "$OUT/loss_curve.log" 2>&1 || echo "loss_curve: exit $?"
    tail -3 "$OUT/loss_curve.log"
    ;;
  sweep-llama1b-k6)
    # issue 15: k6's epilogue also runs the LM head's and the GQA QKV's input gradients
    # (tasks/shapes.toml llama1b-k6), whose configs k6's TUNED table took from the nearest
    # measured shape; long-K tiles (cooperative 256x128, 128x256) beside the pingpong ones.
    # Precompile here first: --tasks k6 --configs 0 2 3 6 8 10 12 13 18 20 22 --parts kernels gemm
    mkdir -p "$OUT"
    install_objects
    timeout "${SWEEP_K6_TIMEOUT_S:-420}" $PY -m lab.bench.run --shape-set llama1b-k6 --tasks k6 \
      --configs 0 2 3 6 8 10 12 13 18 20 22 --reps "${SWEEP_K6_REPS:-20}" --out "$OUT/sweep-llama1b-k6.json" \
      > "$OUT/sweep-llama1b-k6.log" 2>&1 || echo "bench.run: exit $?"
    $PY -m lab.bench.tuning "$OUT/sweep-llama1b-k6.json" --ratios || true
    ;;
  sweep-llama3)
    # issue 15: the fused layer's GEMMs at LLaMA-3's 1B, 8B and 70B layers (tasks/shapes.toml
    # llama3), whose configs at 8B and 70B the TUNED tables take from the nearest measured
    # shape (at 1B k2, k6 and k7 have their own llama1b entries): k0 after the
    # down projection (K = F; at d = 8192 it took twice the addmm's time on an H100,
    # lab/results/h100/training), then k2, k6 and k7 at their own shapes there.
    # Precompile here first: --tasks k0 k2 k6 k7 --configs llama3 --parts kernels gemm
    mkdir -p "$OUT"
    install_objects
    timeout "${SWEEP_LLAMA3_K0_TIMEOUT_S:-200}" $PY -m lab.bench.run --shape-set llama3 --tasks k0 --gemm-k F \
      --configs llama3 --reps "${SWEEP_LLAMA3_REPS:-20}" --out "$OUT/sweep-llama3-k0-down.json" \
      > "$OUT/sweep-llama3-k0-down.log" 2>&1 || echo "bench.run k0: exit $?"
    timeout "${SWEEP_LLAMA3_TIMEOUT_S:-360}" $PY -m lab.bench.run --shape-set llama3 --tasks k2 k6 k7 \
      --configs llama3 --reps "${SWEEP_LLAMA3_REPS:-20}" --out "$OUT/sweep-llama3.json" \
      > "$OUT/sweep-llama3.log" 2>&1 || echo "bench.run k2 k6 k7: exit $?"
    $PY -m lab.bench.tuning "$OUT/sweep-llama3-k0-down.json" "$OUT/sweep-llama3.json" --ratios || true
    ;;
  judge-check)
    mkdir -p "$OUT"
    install_objects
    timeout 300 $PY -m lab.bench.check_gpu --jobs "${JOBS:-6}" --out "$OUT/check.json" > "$OUT/check.log" 2>&1 || true
    grep -E "PASSED|FAIL|s; runner" "$OUT/check.log" | grep -vE "worst/allowed=0\.[0-8]" | tail -40
    ;;
  judge-tests)
    mkdir -p "$OUT"
    install_objects
    fingerprint_line "bash lab/bench/h200.sh judge-tests" > "$OUT/pytest-gpu-eval.log"
    timeout 540 $PY -m pytest -m gpu tests/eval -q -p no:cacheprovider >> "$OUT/pytest-gpu-eval.log" 2>&1 || true
    tail -25 "$OUT/pytest-gpu-eval.log"
    ;;
  judge-exploits)
    # the exploit suite's GPU cases in SHARDS pytest processes side by side (each case is a
    # whole evaluation: ~15 s of process starts), the tolerance margins beside them
    mkdir -p "$OUT" "$STATE"
    install_objects
    MARGINS_BUDGET_S=${MARGINS_BUDGET_S:-300} bash lab/bench/h200.sh judge-margins > "$OUT/margins.log" 2>&1 &
    exploit_shards "" "$OUT/pytest-gpu-exploits.log" "SHARDS=${SHARDS:-4} bash lab/bench/h200.sh judge-exploits" \
      "${EXPLOIT_TIMEOUT_S:-330}"
    wait  # the margins
    tail -3 "$OUT/margins.log"
    grep -E "passed|failed|FAILED|XPASS|ERROR" "$OUT/pytest-gpu-exploits.log" | tail -30
    ;;
  judge-margins)
    # the sets one after another, each a file rewritten after every case; a set cut short by
    # the budget is taken up again by the next call (MARGINS_RESUME: where its files were put)
    mkdir -p "$OUT"
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200" | tr A-Z a-z)
    end=$(( $(date +%s) + ${MARGINS_BUDGET_S:-540} ))
    for set in ${MARGINS_SETS:-smoke heads coda paper}; do
      file="$OUT/margins-${gpu:-gpu}-$set.json"
      [ -n "${MARGINS_RESUME:-}" ] && [ -f "$MARGINS_RESUME/$(basename "$file")" ] && cp "$MARGINS_RESUME/$(basename "$file")" "$file"
      left=$(( end - $(date +%s) ))
      [ "$left" -gt 10 ] || { echo "$set: no time left"; continue; }
      timeout "$left" $PY -m epiforge.tasks.tolerance_margins --shapes "$set" --device cuda --dtype all \
        --out "$file" --resume || echo "$set: exit $?"
    done
    ;;
  judge-compare)
    # epiforge compare, task by task (a cut-off run keeps the tasks done): the expert and the
    # committed generated kernels at the paper shapes beside every standard baseline
    mkdir -p "$OUT"
    install_objects
    for t in ${COMPARE_TASKS:-k8 k1 k0 k2 k3 k4 k5 k6 k7 k9}; do
      timeout "${COMPARE_TIMEOUT_S:-120}" $PY -m epiforge compare --task "$t" --shapes "${COMPARE_SHAPES:-paper}" \
        --device gpu --store "$OUT/compare.sqlite" >> "$OUT/compare.md" 2>> "$OUT/compare.log" \
        || echo "$t: exit $?" >> "$OUT/compare.md"
    done
    grep -E "^\| |exit" "$OUT/compare.md" | head -60
    ;;
  layer)
    # issue 15 section 5: the task of 12 GEMMs on the GPU, first correctness and the launch
    # check (the profiler must count 12 fused GEMMs, rope_backward's Triton kernel and the
    # folds), then one interleaved compare run per paper shape beside the sequence of 12
    # plain GEMMs, eager PyTorch and torch.compile
    mkdir -p "$OUT"
    $PY -m lab.bench.check_gpu --tasks layer --shapes smoke paper --out "$OUT/check-layer.json" | tail -20
    timeout "${LAYER_TIMEOUT_S:-420}" $PY -m epiforge compare --task layer --shapes paper --device gpu \
      --baselines torch_compile --store "$OUT/compare-layer.sqlite" > "$OUT/compare-layer.md" \
      2> "$OUT/compare-layer.log" || echo "compare: exit $?"
    grep -E "^\| |^Judged" "$OUT/compare-layer.md" | head -20 || true
    ;;
  judge-launcher)
    # issue 11: the launcher mode on the GPU. Nothing is timed, so the three run side by side.
    mkdir -p "$OUT" "$STATE"
    install_objects
    timeout 420 $PY -m lab.bench.check_gpu --jobs "${JOBS:-4}" --out "$OUT/check-launcher.json" \
      > "$OUT/check-launcher.log" 2>&1 &
    { fingerprint_line "bash lab/bench/h200.sh judge-launcher"
      timeout 420 $PY -m pytest -m gpu tests/eval/test_launcher.py -q -p no:cacheprovider -rfEX 2>&1 || true
    } > "$OUT/pytest-gpu-launcher.log" &
    exploit_shards launcher "$OUT/pytest-gpu-exploits-launcher.log" "SHARDS=${SHARDS:-4} bash lab/bench/h200.sh judge-launcher" \
      "${EXPLOIT_TIMEOUT_S:-420}"
    wait  # the check and the launcher's GPU test
    tail -3 "$OUT/pytest-gpu-launcher.log"
    grep -E "PASSED|FAIL|s; runner" "$OUT/check-launcher.log" | grep -vE "worst/allowed=0\.[0-8]|PASSED worst" | tail -30
    grep -E "passed|failed|FAILED|XPASS|ERROR" "$OUT/pytest-gpu-exploits-launcher.log" | tail -40
    ;;
  launcher-overhead)
    mkdir -p "$OUT"
    # shellcheck disable=SC2086  # LAUNCHER_TASKS is a list of task ids
    timeout "${LAUNCHER_TIMEOUT_S:-400}" $PY -m lab.bench.launcher_overhead --tasks ${LAUNCHER_TASKS:-k1 k0 k7 k5 k8} \
      --shapes paper --reps "${LAUNCHER_REPS:-30}" --out "$OUT/launcher-overhead.json" 2>&1 | tee "$OUT/launcher-overhead.log" \
      | grep -vE "^installed" || true
    ;;
  quack-upstream)
    # issue 16 section 3: the C-load warp patch's own quack-side test (every case, flag on
    # against off, bit for bit) on a patched copy of the bundle's quack, SHARDS processes
    $PY -m lab.quack_upstream.gpu_test --out "$OUT" --shards "${SHARDS:-8}" \
      --timeout "${UPSTREAM_TIMEOUT_S:-500}" || echo "gpu_test: exit $?"
    grep -E "passed|failed|FAILED|ERROR|killed" "$OUT/pytest-gpu-quack-upstream.log" | tail -20 || true
    ;;
  judge-compare-all)
    # issue 12's benchmark: the whole of `epiforge compare --all --shapes paper` with the
    # precompiled kernels, every default baseline, one judge for all the tasks; how long it
    # took goes beside its tables (compare-all.md, compare-all.sqlite, compare-all.log)
    # COMPARE_TASKS: these tasks (one judge) instead of --all, for a run split over two calls
    # into one store; KERNELS: compare's --kernels (default: its own, expert generated);
    # BASELINES (set, even empty): compare's --baselines; DTYPE: its --dtype; REPS: its --reps
    mkdir -p "$OUT"
    install_objects
    start=$(date +%s)
    rc=0
    which=(--all); [ -n "${COMPARE_TASKS:-}" ] && read -ra which <<< "--task $COMPARE_TASKS"
    kernels=(); [ -n "${KERNELS:-}" ] && read -ra kernels <<< "--kernels $KERNELS"
    more=(); [ -n "${BASELINES+set}" ] && read -ra more <<< "--baselines $BASELINES"
    [ -n "${DTYPE:-}" ] && more+=(--dtype "$DTYPE")
    [ -n "${REPS:-}" ] && more+=(--reps "$REPS")
    [ -s "$OUT/compare-all.log" ] || fingerprint_line "compare ${which[*]} ${kernels[*]} ${more[*]} --shapes paper" > "$OUT/compare-all.log"
    timeout "${COMPARE_ALL_TIMEOUT_S:-580}" $PY -m epiforge compare "${which[@]}" "${kernels[@]}" "${more[@]}" --shapes paper \
      --device gpu --store "$OUT/compare-all.sqlite" >> "$OUT/compare-all.md" 2>> "$OUT/compare-all.log" || rc=$?
    echo "compare ${which[*]} ${kernels[*]} ${more[*]} --shapes paper: exit $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/compare-all.log"
    echo "$(grep -c "^## " "$OUT/compare-all.md" || true) tasks judged"
    grep -E "^Judged in" "$OUT/compare-all.md" | head -20 || true
    ;;
  coda)
    # issue 45 point 1: the coda baseline (eval/coda.py; EPIFORGE_CODA_ENV from lab/bench/stage_coda.sh's
    # coda.sh). CODA_STEP=test: its GPU test at the smoke shapes (CODA autotunes and compiles its
    # configs there: this machine's caches keep them for the next call); CODA_STEP=compare (the
    # default): compare of the mapped tasks' experts (CODA_TASKS: these) with the coda baseline at CODA_SHAPES (paper),
    # bf16, one judge (compare-coda-<shapes>.md, .sqlite, .log)
    mkdir -p "$OUT"
    install_objects
    [ -n "${EPIFORGE_CODA_ENV:-}" ] || { echo "EPIFORGE_CODA_ENV is not set (source .gpu/coda2/coda.sh)"; exit 2; }
    tasks=${CODA_TASKS:-$($PY -c "from epiforge.eval.coda_worker import CONVENTIONS; print(*CONVENTIONS)")}
    if [ "${CODA_STEP:-compare}" = test ]; then
      timeout "${CODA_TIMEOUT_S:-560}" $PY -m pytest -q -x -m gpu tests/eval/test_gpu_coda.py -p no:cacheprovider \
        2>&1 | tee "$OUT/coda-test.log" | tail -30
    else
      shapes=${CODA_SHAPES:-paper}
      fingerprint_line "compare coda $shapes" > "$OUT/compare-coda-$shapes.log"
      start=$(date +%s); rc=0
      # shellcheck disable=SC2086
      timeout "${CODA_TIMEOUT_S:-560}" $PY -m epiforge compare --task $tasks --kernels expert --shapes "$shapes" \
        --device gpu --dtype bf16 --reps "${CODA_REPS:-20}" --baselines coda \
        --store "$OUT/compare-coda-$shapes.sqlite" > "$OUT/compare-coda-$shapes.md" 2>> "$OUT/compare-coda-$shapes.log" || rc=$?
      echo "compare --task $tasks --shapes $shapes --baselines coda: exit $rc after $(( $(date +%s) - start )) s" \
        | tee -a "$OUT/compare-coda-$shapes.log"
      grep -E "coda|^## " "$OUT/compare-coda-$shapes.md" | head -40 || true
    fi
    ;;
  judge-lead)
    # which GPU state the judge times in (eval/timing.py Lead): the same expert kernels under
    # compare with each lead, and under lab/bench/run.py (back to back) before and after
    mkdir -p "$OUT"
    install_objects
    tasks=${LEAD_TASKS:-k0 k8}
    # shellcheck disable=SC2086
    $PY -m lab.bench.run --tasks $tasks --tuned --sol-from $SWEEPS --reps 30 --out "$OUT/lead-bench-1.json" | grep -E "^k[0-9] "
    stores=()
    for lead in ${LEADS:-spin heat:1 heat:3 heat:10}; do
      store="$OUT/lead-${lead//:/-}.sqlite"
      for t in $tasks; do
        EPIFORGE_TIMED_LEAD=$lead timeout 150 $PY -m epiforge compare --task "$t" --shapes paper --device gpu \
          --kernels expert --baselines --store "$store" > /dev/null 2>> "$OUT/lead.log" || echo "$lead $t: exit $?"
      done
      stores+=("$lead=$store")
    done
    # shellcheck disable=SC2086
    $PY -m lab.bench.run --tasks $tasks --tuned --sol-from $SWEEPS --reps 30 --out "$OUT/lead-bench-2.json" | grep -E "^k[0-9] "
    $PY -m lab.bench.lead_study --lead "${stores[@]}" --bench "$OUT/lead-bench-1.json" "$OUT/lead-bench-2.json" \
      --commit "${EPIFORGE_COMMIT:-unknown}" --command "LEADS='${LEADS:-spin heat:1 heat:3 heat:10}' bash lab/bench/h200.sh judge-lead" \
      --out "$OUT/lead-study.md"
    ;;
  judge-noise)
    # issue 12: does compare agree with lab/bench/ within the run-to-run noise? bench, then each
    # lead's compare once per round (NOISE_LEADS, interleaved: heat:3 heat:10 heat:3 heat:10),
    # then bench again, on the same tasks' expert kernels (compare without the built
    # baselines: the speed of light is the same in both)
    mkdir -p "$OUT"
    install_objects
    tasks=${NOISE_TASKS:-k0 k1 k2 k3 k4 k5 k8}
    leads=${NOISE_LEADS:-${EPIFORGE_TIMED_LEAD:-heat:3}}
    start=$(date +%s)
    # shellcheck disable=SC2086
    $PY -m lab.bench.run --tasks $tasks --tuned --sol-from $SWEEPS --reps 30 --out "$OUT/noise-bench-1.json" | grep -E "^k[0-9] "
    stores=()
    for run in $(seq 1 "${NOISE_ROUNDS:-2}"); do
      for label in $leads; do
        # LEAD or LEAD@N: compare under that lead with N timed repetitions per shape (default 30)
        lead=${label%@*}
        reps=30
        [ "$label" = "$lead" ] || reps=${label#*@}
        name="noise-compare-${label//[:@]/-}-$run"
        # shellcheck disable=SC2086
        EPIFORGE_TIMED_LEAD=$lead timeout "${NOISE_COMPARE_TIMEOUT_S:-200}" $PY -m epiforge compare --task $tasks \
          --shapes paper --device gpu --kernels expert --baselines --reps "$reps" --store "$OUT/$name.sqlite" \
          > "$OUT/$name.md" 2>> "$OUT/noise.log" || echo "compare $label run $run: exit $?"
        stores+=("$label=$OUT/$name.sqlite")
        echo "compare $label run $run done at $(( $(date +%s) - start )) s"
      done
    done
    # shellcheck disable=SC2086
    $PY -m lab.bench.run --tasks $tasks --tuned --sol-from $SWEEPS --reps 30 --out "$OUT/noise-bench-2.json" | grep -E "^k[0-9] "
    $PY -m lab.bench.lead_study --lead "${stores[@]}" --bench "$OUT/noise-bench-1.json" "$OUT/noise-bench-2.json" \
      --commit "${EPIFORGE_COMMIT:-unknown}" \
      --command "NOISE_TASKS='$tasks' NOISE_LEADS='$leads' NOISE_ROUNDS=${NOISE_ROUNDS:-2} bash lab/bench/h200.sh judge-noise" \
      --out "$OUT/noise.md"
    echo "judge-noise: $(( $(date +%s) - start )) s"
    ;;
  *)
    echo "usage: lab/bench/h200.sh confirm|final|rerun|profile|profile-stalls|judge-check|judge-tests|judge-exploits|judge-compare|judge-compare-all|judge-lead|judge-noise|judge-launcher|launcher-overhead|layer|profile-epilogue-stalls|epi-tile|quack-upstream|c-load-ceiling|chain-cl|training-check|sweep-llama1b-k6|sweep-llama3" >&2
    exit 2
    ;;
esac
