#!/usr/bin/env bash
# The CI job's steps, in one script: the GitHub Actions workflow
# (.github/workflows/ci.yml) runs it, and so does .ci/run, so what the workflow
# does is what CI here exercises.
#
#   scripts/ci_steps.sh [--skip-tests | --only-tests] [--shard I/N | --gather]
#
# 1. the tests (skipped with --skip-tests, for a caller that has just run them;
#    --only-tests stops after them);
# 2. `doit verify`: build what is stale (pulling from the remote cache when one
#    is set), verify, push what verified, write the lock file. With --shard I/N
#    only shard I of N (an artifact with its sources, balanced by recorded cost);
#    with --gather nothing is built: `--pull-only` pulls every artifact the shards
#    pushed (an artifact no shard pushed is an error naming it, not a rebuild);
# 3. `doit publish --to "$EDGEBUILD_PUBLISH_TO"` when that is set (the workflow
#    sets it on the main branch only), except in a shard: the gather step publishes.
#    Publishing needs a committed work tree; EDGEBUILD_ALLOW_DIRTY=1 passes
#    --allow-dirty (for a local rehearsal, never in the workflow).
#
# Environment: EDGEBUILD_REMOTE_CACHE (optional; required by --gather),
# EDGEBUILD_REMOTE_CACHE_READONLY (pull requests: pull, never push),
# EDGEBUILD_PUBLISH_TO (optional), EDGEBUILD_S3_ENDPOINT_URL and the AWS_*
# credentials for s3:// locations, EDGEBUILD_VENV (default .venv: where the
# project is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EDGEBUILD_VENV:-.venv}

tests=run
selection=()
gather=
while [ $# -gt 0 ]; do
    case "$1" in
        --skip-tests) tests=skip ;;
        --only-tests) tests=only ;;
        --shard) selection=(--shard "$2"); shift ;;
        --gather) gather=1; selection=(--pull-only) ;;
        *) echo "ci: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

# pytest_passed WHAT PYTEST-ARGUMENTS...: run pytest; stop with its status unless it
# passed. Exit 5 (nothing collected) is a failure: a selection that runs no test has
# checked nothing.
pytest_passed() {
    local what=$1 status=0
    shift
    "$venv/bin/python" -m pytest "$@" || status=$?
    if [ "$status" -eq 5 ]; then
        echo "ci: pytest collected no $what; that is a failure, not a pass" >&2
        exit 1
    fi
    [ "$status" -eq 0 ] || exit "$status"
}

if [ "$tests" != skip ]; then
    echo "ci: tests" >&2
    # The set-up installed the test extra (and the runner ships a browser): a test that
    # would skip for want of any of it fails instead (tests/conftest.py).
    EDGEBUILD_REQUIRE_ALL_TESTS=1 pytest_passed tests -n auto --dist worksteal
    # The workflow tests and the install test, apart from the suite (README, "Quickstart").
    EDGEBUILD_REQUIRE_ALL_TESTS=1 pytest_passed "workflow test" -n auto --dist worksteal -m workflow
    pytest_passed "install test" -m install
    [ "$tests" != only ] || exit 0
fi

echo "ci: doit verify ${selection[*]:-} (remote cache: ${EDGEBUILD_REMOTE_CACHE:-none}${EDGEBUILD_REMOTE_CACHE_READONLY:+, read-only})" >&2
"$venv/bin/doit" verify "${selection[@]}"

if [ -n "${EDGEBUILD_PUBLISH_TO:-}" ] && [ "${selection[0]:-}" != --shard ]; then
    echo "ci: doit publish --to $EDGEBUILD_PUBLISH_TO" >&2
    "$venv/bin/doit" publish ${gather:+--pull-only} --to "$EDGEBUILD_PUBLISH_TO" ${EDGEBUILD_ALLOW_DIRTY:+--allow-dirty}
else
    echo "ci: nothing published here (EDGEBUILD_PUBLISH_TO unset, or a shard: the gather step publishes)" >&2
fi
