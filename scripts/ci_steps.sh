#!/usr/bin/env bash
# The CI job's steps, in one script: the GitHub Actions workflow
# (.github/workflows/ci.yml) runs it, and so does .ci/run, so what the workflow
# does is what CI here exercises.
#
#   scripts/ci_steps.sh [--skip-tests]
#
# 1. the tests (skipped with --skip-tests, for a caller that has just run them);
# 2. `doit verify`: build what is stale (pulling from the remote cache when one
#    is set), verify every artifact, push what verified, write the lock file;
# 3. `doit publish --to "$EDGEBUILD_PUBLISH_TO"` when that is set (the workflow
#    sets it on the main branch only); otherwise nothing is published. Publishing
#    needs a committed work tree; EDGEBUILD_ALLOW_DIRTY=1 passes --allow-dirty
#    (for a local rehearsal, never in the workflow).
#
# Environment: EDGEBUILD_REMOTE_CACHE (optional), EDGEBUILD_PUBLISH_TO (optional),
# EDGEBUILD_S3_ENDPOINT_URL and the AWS_* credentials for s3:// locations,
# EDGEBUILD_VENV (default .venv: where the project is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EDGEBUILD_VENV:-.venv}

if [ "${1:-}" != "--skip-tests" ]; then
    echo "ci: tests" >&2
    status=0
    "$venv/bin/python" -m pytest || status=$?
    if [ "$status" -eq 5 ]; then
        echo "ci: pytest collected no tests; that is a failure, not a pass" >&2
        exit 1
    fi
    [ "$status" -eq 0 ] || exit "$status"
fi

echo "ci: doit verify (remote cache: ${EDGEBUILD_REMOTE_CACHE:-none})" >&2
"$venv/bin/doit" verify

if [ -n "${EDGEBUILD_PUBLISH_TO:-}" ]; then
    echo "ci: doit publish --to $EDGEBUILD_PUBLISH_TO" >&2
    "$venv/bin/doit" publish --to "$EDGEBUILD_PUBLISH_TO" ${EDGEBUILD_ALLOW_DIRTY:+--allow-dirty}
else
    echo "ci: EDGEBUILD_PUBLISH_TO is not set; nothing published" >&2
fi
