#!/usr/bin/env bash
# CODA's environment (the `coda` baseline of `epiforge compare`, eval/coda.py) for a GPU machine
# that cannot download: built here for its Python (3.12, CUDA 13 torch), packed as one xz
# archive, split in two parts that each fit a device call beside the working tree.
#
#   lab/bench/stage_coda.sh          # here: .gpu/coda1/coda.part00, .gpu/coda2/coda.part01 + coda.sh
#   on the GPU machine, after the bundle (../shared/gpu/README.md):
#     carry [".gpu/coda1"]               cp .gpu/coda1/* /tmp/
#     carry [".gpu/coda2", ".gpu/env"]   source .gpu/env/env.sh && source .gpu/coda2/coda.sh && ...
#   coda.sh unpacks it into /tmp/coda-env once per machine and exports EPIFORGE_CODA_ENV.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
BUILD=${BUILD:-/tmp/epiforge-coda-env-312}
PART_BYTES=${PART_BYTES:-40000000}
PLATFORM=(--python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --only-binary=:all:)
rm -rf "$BUILD" && mkdir -p "$BUILD"
# the packages eval/coda.py's install puts there (PACKAGES, CUDA_LIBS["13"]), for the GPU machine's Python
mapfile -t PKGS < <($PY -c "from epiforge.eval.coda import PACKAGES, CUDA_LIBS; print(*[p for p in PACKAGES if p != 'ipdb'], CUDA_LIBS['13'], sep='\n')")
$PY -m pip install -q --target "$BUILD" --no-deps "${PLATFORM[@]}" "${PKGS[@]}"
$PY -m pip install -q --target "$BUILD.ipdb" "${PLATFORM[@]}" ipdb  # CODA imports ipdb: it and its own
cp -rn "$BUILD.ipdb"/. "$BUILD"/ && rm -rf "$BUILD.ipdb" "$BUILD/bin"
rm -rf .gpu/coda1 .gpu/coda2 && mkdir -p .gpu/coda1 .gpu/coda2
tar cf - -C "$BUILD" . | nice -n 19 xz -6 -T1 | split -b "$PART_BYTES" -d - .gpu/coda1/coda.part
for p in .gpu/coda1/coda.part0[1-9]; do [ -e "$p" ] && mv "$p" .gpu/coda2/; done
cat > .gpu/coda2/coda.sh <<'SH'
# on the GPU machine, from the repo root, after .gpu/coda1's part went to /tmp: source me
if [ ! -f /tmp/coda-env/.ok ]; then
  rm -rf /tmp/coda-env && mkdir -p /tmp/coda-env
  cat /tmp/coda.part00 .gpu/coda2/coda.part0* | xz -d -T8 | tar xf - -C /tmp/coda-env && touch /tmp/coda-env/.ok
fi
export EPIFORGE_CODA_ENV=/tmp/coda-env
SH
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
du -ch .gpu/coda1/* .gpu/coda2/* | tail -1
