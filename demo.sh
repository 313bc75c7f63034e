#!/usr/bin/env bash
# The main job on its embedded default: no API key, no GPU (sets up .venv/ on first use).
set -euo pipefail
cd "$(dirname "$0")"
.ci/setup-venv
exec .venv/bin/epiforge demo "$@"
