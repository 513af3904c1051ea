#!/usr/bin/env bash
# Run every test tier, each in a pytest process of its own (unit first: the quickest word):
# one process for all of them gets slower as it goes (the suite took 2,557 s in one process
# where its tiers took 1,855 s one by one). Tiers that cannot run here are skipped with
# their reason printed (-rs); pytest's "no tests collected" (exit 5) is not a failure.
# Arguments go to every tier's pytest; given paths (tests/...), one pytest runs just those.
# The unit tier (pure logic, no lab) runs on every core (pytest-xdist): 123 s instead of 246-270 s
# on 2 cores. The other tiers time real processes and labs: one test at a time. Each tier
# names its slowest tests (--durations), which is where CI's 45 minutes go.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
PYTEST=(.venv/bin/python -m pytest -rs -p no:cacheprovider --durations=12 --durations-min=5)

for arg in "$@"; do
    if [[ $arg == tests* ]]; then
        "${PYTEST[@]}" "$@"
        rc=$?
        .venv/bin/testbed clean --all >/dev/null 2>&1 || true
        [ $rc -eq 5 ] && rc=0
        exit $rc
    fi
done

tiers=(unit)
for dir in tests/*/; do
    tier=$(basename "$dir")
    [ "$tier" = unit ] || ! compgen -G "$dir/test_*.py" >/dev/null || tiers+=("$tier")
done
# What the tiers after unit build first (lab images, PyTorch's image, the vm tier's kernels
# and disk: minutes on a fresh machine) is built beside the unit tier, which times nothing;
# the tiers that time real processes start once it is done (tests/prepare.py).
prepared=$(mktemp -t testbed-prepare.XXXXXX)
setsid .venv/bin/python -m tests.prepare >"$prepared" 2>&1 &  # a process group of its own:
preparing=$!  # the trap ends its builders too (debootstrap, mkfs, apt) if the tiers end first
trap '[ -z "$preparing" ] || kill -TERM -- -"$preparing" 2>/dev/null; rm -f "$prepared"' EXIT
prepared_by() {  # wait for it, then say what it built and how long the tiers waited
    local waited_from=$SECONDS
    wait "$preparing"
    printf '\n\033[1m==> built beside the unit tier (the tiers waited %d s more for it)\033[0m\n' \
        $((SECONDS - waited_from))
    cat "$prepared"
    preparing=
}
rc=0
summary=()
for tier in "${tiers[@]}"; do
    [ -z "$preparing" ] || [ "$tier" = unit ] || prepared_by
    printf '\n\033[1m==> test tier %s\033[0m\n' "$tier"
    start=$SECONDS
    spread=()
    [ "$tier" = unit ] && spread=(-n auto)
    "${PYTEST[@]}" "${spread[@]}" "tests/$tier" "$@"
    status=$?
    [ $status -eq 5 ] && status=0
    [ $status -ne 0 ] && [ $rc -eq 0 ] && rc=$status
    summary+=("$tier: $([ $status -eq 0 ] && echo passed || echo "FAILED (exit $status)") in $((SECONDS - start)) s")
done
[ -z "$preparing" ] || prepared_by
.venv/bin/testbed clean --all >/dev/null 2>&1 || true
printf '\n\033[1m==> tiers\033[0m\n'
printf '  %s\n' "${summary[@]}"
exit $rc
