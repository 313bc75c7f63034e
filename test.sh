#!/usr/bin/env bash
# Run the test suite on this machine (sets up .venv/ on first use). Extra args go to pytest.
# Two pytest workers (EPIFORGE_TEST_WORKERS; 0: none), each handed the next test as it
# frees up: CI's machine has two cores, and many tests wait on processes of their own. The
# 25 slowest tests are listed at the end: CI has 30 minutes.
set -euo pipefail
cd "$(dirname "$0")"
.ci/setup-venv
exec .venv/bin/python -m pytest -q -n "${EPIFORGE_TEST_WORKERS:-2}" --dist worksteal --durations=25 "$@"
