"""The CI files ``python -m edgebuild init --ci github|script`` writes for a user's repository.

- ``ci/edgebuild.sh``: every step, in one script any CI system can call (``--check``,
  ``--download``, ``--shard I/N``, ``--gather``);
- with ``--ci github``, also ``.github/workflows/edgebuild.yml``: a thin workflow that
  sets up Python, restores ``cache/`` and calls the script -- a check job, a shard
  matrix, and a gather job that pulls and publishes on the main branch; pull requests
  read the remote cache and never write it; the signing key comes from a secret, the
  trusted keys from a committed ``.pub``.

``tests/test_scaffold.py`` checks the workflow's layout against what docs/how-to/ci-for-your-repository.md says.
"""

from __future__ import annotations

SCRIPT_FILE = "ci/edgebuild.sh"
WORKFLOW_FILE = ".github/workflows/edgebuild.yml"
CI_CHOICES = ("github", "script")
# The jobs of the workflow, in order: what the documentation's table lists.
WORKFLOW_JOBS = ("check", "shard", "gather")

SCRIPT = r'''#!/usr/bin/env bash
# edgebuild's CI steps for this repository (written by `python -m edgebuild init --ci`).
# Any CI system can call it; .github/workflows/edgebuild.yml does.
#
#   ci/edgebuild.sh --check        the manifest, deeply: checkpoints open, parameters fit, inputs exist
#   ci/edgebuild.sh --download     fetch every hf: checkpoint of the manifest into the Hugging Face cache
#   ci/edgebuild.sh --shard I/N    build, verify and push shard I of N (a runner of the matrix)
#   ci/edgebuild.sh --gather       pull everything the shards pushed (exporting nothing), then publish
#
# Environment (all optional but where said):
#   EDGEBUILD_REMOTE_CACHE           where shards push and the gather pulls (required by --gather)
#   EDGEBUILD_REMOTE_CACHE_READONLY  1 on pull requests: pull, never push
#   EDGEBUILD_SIGNING_KEY            a private key file: pushes and releases are signed (trusted builds only)
#   EDGEBUILD_TRUSTED_KEYS           committed public keys: pulled builds they signed count as verified
#   EDGEBUILD_FROZEN                 1: the gather pulls by the committed artifacts.lock, no checkpoint needed
#   EDGEBUILD_PUBLISH_TO             where the gather publishes (set it on the main branch only)
#   PYTHON                           the interpreter edgebuild is installed in (default: python3)
set -euo pipefail
python=${PYTHON:-python3}
doit=("$python" -m doit)

case "${1:-}" in
    --check)
        "$python" -m edgebuild check --deep
        ;;
    --download)
        "$python" - <<'PY' | while read -r repo revision; do hf download "$repo" --revision "$revision" >/dev/null; done
from edgebuild.core.manifest import load_manifest

for spec in load_manifest().checkpoints.values():
    if spec.hf:
        print(spec.hf, spec.hf_revision)
PY
        ;;
    --shard)
        [ -n "${2:-}" ] || { echo "ci: --shard needs I/N" >&2; exit 2; }
        "${doit[@]}" verify --shard "$2"
        ;;
    --gather)
        [ -n "${EDGEBUILD_REMOTE_CACHE:-}" ] || { echo "ci: --gather pulls from EDGEBUILD_REMOTE_CACHE, and it is not set" >&2; exit 2; }
        mode=--pull-only
        case "${EDGEBUILD_FROZEN:-}" in 1|true|yes|on) mode=--frozen ;; esac
        "${doit[@]}" verify "$mode"
        if [ -n "${EDGEBUILD_PUBLISH_TO:-}" ]; then
            "${doit[@]}" publish "$mode" --to "$EDGEBUILD_PUBLISH_TO"
        fi
        ;;
    *)
        echo "usage: ci/edgebuild.sh --check | --download | --shard I/N | --gather" >&2
        exit 2
        ;;
esac
'''

WORKFLOW = r'''# edgebuild for this repository (written by `python -m edgebuild init --ci github`):
# the manifest checked, every artifact built and verified by a matrix of shards, and on
# main a gather job that pulls what the shards pushed (exporting nothing) and publishes.
# The steps are ci/edgebuild.sh; this file sets up Python, restores cache/ and passes
# the configuration in.
#
# Repository configuration (Settings -> Secrets and variables -> Actions):
#   vars.EDGEBUILD_PACKAGE          what to pip install (default: edgebuild[sign]); a path, a git URL, a version
#   vars.EDGEBUILD_REMOTE_CACHE     e.g. s3://team-bucket/edgebuild/cache (required: the shards hand builds over through it)
#   vars.EDGEBUILD_PUBLISH_TO       e.g. s3://team-bucket/edgebuild/published (optional)
#   vars.EDGEBUILD_TRUSTED_KEYS     the committed public key(s), e.g. keys/ci.pub (optional; without, the gather judges again)
#   vars.EDGEBUILD_S3_ENDPOINT_URL  an S3-compatible server other than AWS (optional)
#   vars.AWS_DEFAULT_REGION, secrets.AWS_ACCESS_KEY_ID, secrets.AWS_SECRET_ACCESS_KEY
#   secrets.EDGEBUILD_SIGNING_KEY   the PEM of `python -m edgebuild keygen keys/ci`'s keys/ci.key (optional)
#   secrets.HF_TOKEN                for gated or private hf: checkpoints (optional)
name: edgebuild

on:
  push:
    branches: [main]
  pull_request:
  workflow_dispatch:

permissions:
  contents: read

env:
  SHARDS: 2
  EDGEBUILD_REMOTE_CACHE: ${{ vars.EDGEBUILD_REMOTE_CACHE }}
  EDGEBUILD_TRUSTED_KEYS: ${{ vars.EDGEBUILD_TRUSTED_KEYS }}
  EDGEBUILD_S3_ENDPOINT_URL: ${{ vars.EDGEBUILD_S3_ENDPOINT_URL }}
  AWS_DEFAULT_REGION: ${{ vars.AWS_DEFAULT_REGION || 'us-east-1' }}
  AWS_ACCESS_KEY_ID: ${{ secrets.AWS_ACCESS_KEY_ID }}
  AWS_SECRET_ACCESS_KEY: ${{ secrets.AWS_SECRET_ACCESS_KEY }}
  HF_TOKEN: ${{ secrets.HF_TOKEN }}
  # Only builds of the protected branch may write where everyone pulls from.
  TRUSTED_BUILD: ${{ github.event_name == 'push' && github.ref == 'refs/heads/main' }}

jobs:
  check:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: Install edgebuild
        run: python3 -m pip install "${{ vars.EDGEBUILD_PACKAGE || 'edgebuild[sign]' }}"
      - name: Download the hf checkpoints
        run: bash ci/edgebuild.sh --download
      - name: Check the manifest
        run: bash ci/edgebuild.sh --check

  shard:
    needs: check
    runs-on: ubuntu-latest
    strategy:
      fail-fast: false
      matrix:
        shard: [1, 2]
    env:
      SIGNING_KEY_PEM: ${{ secrets.EDGEBUILD_SIGNING_KEY }}
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: Restore cache/
        uses: actions/cache@v4
        with:
          path: cache/
          key: edgebuild-${{ runner.os }}-shard${{ matrix.shard }}-${{ hashFiles('artifacts.yaml', 'artifacts.lock') }}
          restore-keys: |
            edgebuild-${{ runner.os }}-
      - name: Install edgebuild
        run: python3 -m pip install "${{ vars.EDGEBUILD_PACKAGE || 'edgebuild[sign]' }}"
      - name: Download the hf checkpoints
        run: bash ci/edgebuild.sh --download
      # A pull request reads the shared cache and never writes it; only main signs.
      - name: Read-only on pull requests, signed on main
        run: |
          if [ "$TRUSTED_BUILD" != true ]; then echo "EDGEBUILD_REMOTE_CACHE_READONLY=1" >> "$GITHUB_ENV"; fi
          if [ "$TRUSTED_BUILD" = true ] && [ -n "$SIGNING_KEY_PEM" ]; then
            (umask 077 && printf '%s\n' "$SIGNING_KEY_PEM" > "$RUNNER_TEMP/signing.key")
            echo "EDGEBUILD_SIGNING_KEY=$RUNNER_TEMP/signing.key" >> "$GITHUB_ENV"
          fi
      - name: Build and verify shard ${{ matrix.shard }}
        run: bash ci/edgebuild.sh --shard ${{ matrix.shard }}/$SHARDS

  gather:
    needs: shard
    # Pull requests push nothing to gather: their shards are the check.
    if: github.event_name == 'push' && github.ref == 'refs/heads/main'
    runs-on: ubuntu-latest
    env:
      SIGNING_KEY_PEM: ${{ secrets.EDGEBUILD_SIGNING_KEY }}
      EDGEBUILD_PUBLISH_TO: ${{ vars.EDGEBUILD_PUBLISH_TO }}
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - name: Install edgebuild
        run: python3 -m pip install "${{ vars.EDGEBUILD_PACKAGE || 'edgebuild[sign]' }}"
      # --pull-only fingerprints from the checkpoints; EDGEBUILD_FROZEN=1 (with a trusted
      # key and a committed artifacts.lock) pulls by the lock and needs none.
      - name: Download the hf checkpoints
        if: vars.EDGEBUILD_FROZEN != '1'
        run: bash ci/edgebuild.sh --download
      - name: Sign releases
        run: |
          if [ -n "$SIGNING_KEY_PEM" ]; then
            (umask 077 && printf '%s\n' "$SIGNING_KEY_PEM" > "$RUNNER_TEMP/signing.key")
            echo "EDGEBUILD_SIGNING_KEY=$RUNNER_TEMP/signing.key" >> "$GITHUB_ENV"
          fi
      - name: Gather (pull and check every artifact), publish
        env:
          EDGEBUILD_FROZEN: ${{ vars.EDGEBUILD_FROZEN }}
        run: bash ci/edgebuild.sh --gather
'''


def ci_files(kind: str) -> dict[str, tuple[str, str]]:
    """Relative path -> (what it is, its text) for ``init --ci KIND``."""
    files = {SCRIPT_FILE: ("the CI steps script", SCRIPT)}
    if kind == "github":
        files[WORKFLOW_FILE] = ("a GitHub Actions workflow", WORKFLOW)
    return files
