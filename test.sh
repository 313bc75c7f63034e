#!/usr/bin/env bash
# Run the test suite on this machine (sets up .venv/ on first use). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
.ci/setup-venv
exec .venv/bin/python -m pytest -q "$@"
