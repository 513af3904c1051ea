#!/usr/bin/env bash
# Run every test tier. Tiers that cannot run here are skipped with their reason printed
# (-rs). pytest's "no tests collected" (exit 5) is not a failure.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
.venv/bin/python -m pytest tests -rs -p no:cacheprovider "$@"
rc=$?
if [ $rc -eq 5 ]; then rc=0; fi
.venv/bin/testbed clean --all >/dev/null 2>&1 || true
exit $rc
