#!/usr/bin/env bash
# The whole CPU test suite (GPU / TensorRT cases skip themselves). Extra arguments go to
# pytest, e.g. `./test.sh -m "not slow"` for the quick tier.
set -uo pipefail
source "$(dirname "$0")/scripts/bootstrap.sh"
cd "$(dirname "$0")"
python -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi
exit "$rc"
