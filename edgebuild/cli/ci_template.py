"""The CI files ``python -m edgebuild init --ci github|script`` writes for a user's repository.

- ``ci/requirements.txt``: what a runner installs -- edgebuild with the extras the
  project's kinds need and ``sign``, and the package each plugin kind comes from, each
  as this machine installed it (a version from a package index, a git commit, a wheel's
  URL); one that a runner cannot reach (a local directory) is refused unless
  ``--requirement`` says where the runner gets it;
- ``ci/edgebuild.sh``: every step, in one script any CI system can call (``--check``,
  ``--download``, ``--versions``, ``--shard I/N``, ``--lock DIR``, ``--gather``);
- with ``--ci github``, also ``.github/workflows/edgebuild.yml``: a thin workflow that
  installs ``ci/requirements.txt``, restores ``cache/`` (keyed by the installed versions)
  and calls the script -- a check job, a shard matrix, a lock job that merges the lock
  files the shards wrote and fails when the committed one differs, and a gather job that
  pulls and publishes on the main branch. Pull requests read the remote cache and never
  write it; without a shared remote cache the shards hand their builds to the gather job
  as workflow artifacts; the signing key comes from a secret, the trusted keys from a
  committed ``.pub``, and the signing key from a secret of the environment
  ``edgebuild-signing`` (main only): a pull request's jobs run in no environment and never
  see it; every job has a timeout; actions are pinned by commit.

``tests/test_scaffold.py`` checks the workflow's layout against what
docs/how-to/ci-for-your-repository.md says, lints it with actionlint and zizmor, and runs
the script's steps on a fresh project.
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from typing import Any, Iterable

from edgebuild.errors import InitError

SCRIPT_FILE = "ci/edgebuild.sh"
REQUIREMENTS_FILE = "ci/requirements.txt"
WORKFLOW_FILE = ".github/workflows/edgebuild.yml"
CI_CHOICES = ("github", "script")
# The jobs of the workflow, in order: what the documentation's table lists.
WORKFLOW_JOBS = ("check", "shard", "lock", "gather")
# Every edgebuild install in CI signs what it publishes.
ALWAYS_EXTRAS = ("sign",)

SCRIPT = r'''#!/usr/bin/env bash
# edgebuild's CI steps for this repository (written by `python -m edgebuild init --ci`).
# Any CI system can call it, after `pip install -r ci/requirements.txt`;
# .github/workflows/edgebuild.yml does.
#
#   ci/edgebuild.sh --check        the manifest, deeply, as a runner sees it: checkpoints open, parameters fit,
#                                  inputs exist, a path: checkpoint that is not here says what to do instead
#   ci/edgebuild.sh --download     fetch every hf: checkpoint of the manifest into the Hugging Face cache
#   ci/edgebuild.sh --versions     a digest of every installed package's version (a cache key: edgebuild's
#                                  and its plugins' among them)
#   ci/edgebuild.sh --shard I/N    build, verify and push shard I of N (a runner of the matrix); writes the lock file
#   ci/edgebuild.sh --lock DIR     merge the lock files the shards wrote (found under DIR) into the lock file;
#                                  fail when the committed one differs (frozen runs pull by it)
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
        "$python" -m edgebuild check --deep --ci
        ;;
    --download)
        "$python" - <<'PY' | while read -r repo revision; do hf download "$repo" --revision "$revision" >/dev/null; done
from edgebuild.core.manifest import load_manifest

for spec in load_manifest().checkpoints.values():
    if spec.hf:
        print(spec.hf, spec.hf_revision)
PY
        ;;
    --versions)
        "$python" -m pip freeze --all | sha256sum | cut -c1-16
        ;;
    --shard)
        [ -n "${2:-}" ] || { echo "ci: --shard needs I/N" >&2; exit 2; }
        "${doit[@]}" verify --shard "$2"
        ;;
    --lock)
        [ -d "${2:-}" ] || { echo "ci: --lock needs the directory holding the lock files the shards wrote" >&2; exit 2; }
        locks=()
        while IFS= read -r -d '' lock; do locks+=("$lock"); done < <(find "$2" -type f -name '*.lock' -print0 | sort -z)
        "$python" -m edgebuild merge-locks "${locks[@]}"
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
        echo "usage: ci/edgebuild.sh --check | --download | --versions | --shard I/N | --lock DIR | --gather" >&2
        exit 2
        ;;
esac
'''

# Actions pinned by commit (a tag can be moved to other code), with the release in a comment.
CHECKOUT = "actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1"
SETUP_PYTHON = "actions/setup-python@5fda3b95a4ea91299a34e894583c3862153e4b97 # v7.0.0"
CACHE = "actions/cache@27d5ce7f107fe9357f9df03efb73ab90386fccae # v5.0.5"
UPLOAD_ARTIFACT = "actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f # v7.0.0"
DOWNLOAD_ARTIFACT = "actions/download-artifact@3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c # v8.0.1"

# Every job's first steps: the repository, Python, what ci/requirements.txt names.
_SET_UP = f'''      - uses: {CHECKOUT}
        with:
          persist-credentials: false
      - uses: {SETUP_PYTHON}
        with:
          python-version: "3.11"
          cache: pip
          cache-dependency-path: ci/requirements.txt
      - name: Install edgebuild (ci/requirements.txt, and the tool environments its kinds need)
        run: python3 -m pip install -r ci/requirements.txt && python3 -m edgebuild toolenv --needed'''

WORKFLOW = r'''# edgebuild for this repository (written by `python -m edgebuild init --ci github`):
# the manifest checked, every artifact built and verified by a matrix of shards, the lock
# file the shards wrote checked against the committed one, and on main a gather job that
# pulls what the shards pushed (exporting nothing) and publishes. The steps are
# ci/edgebuild.sh; what every job installs is ci/requirements.txt.
#
# Repository configuration (Settings -> Secrets and variables -> Actions), all optional:
#   vars.EDGEBUILD_REMOTE_CACHE     e.g. s3://team-bucket/edgebuild/cache, shared by every run (without it
#                                   the shards hand their builds to the gather job as workflow artifacts)
#   vars.EDGEBUILD_PUBLISH_TO       e.g. s3://team-bucket/edgebuild/published
#   vars.EDGEBUILD_TRUSTED_KEYS     the committed public key(s), e.g. keys/ci.pub (without, the gather judges again)
#   vars.EDGEBUILD_FROZEN           1: the gather pulls by the committed artifacts.lock, with no checkpoint
#   vars.EDGEBUILD_S3_ENDPOINT_URL  an S3-compatible server other than AWS
#   vars.AWS_DEFAULT_REGION, secrets.AWS_ACCESS_KEY_ID, secrets.AWS_SECRET_ACCESS_KEY
#   the environment edgebuild-signing (Settings -> Environments), its deployment branches main only,
#   and in it the secret EDGEBUILD_SIGNING_KEY: the PEM of `python -m edgebuild keygen keys/ci`'s
#   keys/ci.key (an environment's secret, not the repository's: a pull request can read those)
#   secrets.HF_TOKEN                for gated or private hf: checkpoints
# More shards: more numbers in the shard job's matrix (N is the matrix's size).
name: edgebuild

on:
  push:
    branches: [main]
  pull_request:
  workflow_dispatch:

permissions:
  contents: read

# A newer push to a pull request replaces its run; runs of main all finish (they publish).
concurrency:
  group: edgebuild-${{ github.ref }}
  cancel-in-progress: ${{ github.event_name == 'pull_request' }}

env:
  # The shared remote cache, if any: the shard and gather jobs set EDGEBUILD_REMOTE_CACHE from it.
  SHARED_REMOTE_CACHE: ${{ vars.EDGEBUILD_REMOTE_CACHE }}
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
    name: check the manifest
    runs-on: ubuntu-latest
    timeout-minutes: 30
    steps:
@SET_UP@
      - name: Download the hf checkpoints
        run: bash ci/edgebuild.sh --download
      - name: Check the manifest as a runner sees it
        run: bash ci/edgebuild.sh --check

  shard:
    name: shard ${{ matrix.shard }}
    needs: check
    runs-on: ubuntu-latest
    timeout-minutes: 120
    strategy:
      fail-fast: false
      matrix:
        shard: [1, 2]
    # The signing key is a secret of the environment edgebuild-signing, which only main may
    # deploy to: a pull request's shards run in no environment, so neither they nor anything
    # a pull request changes can read the key.
    environment: ${{ (github.event_name == 'push' && github.ref == 'refs/heads/main') && 'edgebuild-signing' || '' }}
    env:
      # Shard I of N: N is the matrix's size, so the list above is the one place to change it.
      SHARD: ${{ matrix.shard }}/${{ strategy.job-total }}
    steps:
@SET_UP@
      - name: The installed versions (the cache key follows them)
        id: versions
        run: echo "digest=$(bash ci/edgebuild.sh --versions)" >> "$GITHUB_OUTPUT"
      - name: Restore cache/
        uses: @CACHE@
        with:
          path: cache/
          key: edgebuild-${{ runner.os }}-${{ steps.versions.outputs.digest }}-shard${{ matrix.shard }}-${{ hashFiles('artifacts.yaml', 'artifacts.lock') }}
          restore-keys: |
            edgebuild-${{ runner.os }}-${{ steps.versions.outputs.digest }}-shard${{ matrix.shard }}-
            edgebuild-${{ runner.os }}-${{ steps.versions.outputs.digest }}-
      - name: Download the hf checkpoints
        run: bash ci/edgebuild.sh --download
      # Without a shared remote cache the shards push to a directory the gather job gets as
      # workflow artifacts. A pull request reads the shared cache and never writes it.
      - name: Remote cache; read-only on pull requests
        run: |
          remote=${SHARED_REMOTE_CACHE:-$RUNNER_TEMP/edgebuild-remote}
          if [ -z "$SHARED_REMOTE_CACHE" ]; then mkdir -p "$remote"; fi
          echo "EDGEBUILD_REMOTE_CACHE=$remote" >> "$GITHUB_ENV"
          if [ "$TRUSTED_BUILD" != true ]; then echo "EDGEBUILD_REMOTE_CACHE_READONLY=1" >> "$GITHUB_ENV"; fi
      # Only main signs what it pushes: this step alone reads the key, and runs on main only.
      - name: The signing key (main only)
        if: env.TRUSTED_BUILD == 'true'
        env:
          SIGNING_KEY_PEM: ${{ secrets.EDGEBUILD_SIGNING_KEY }}
        run: |
          if [ -n "$SIGNING_KEY_PEM" ]; then
            (umask 077 && printf '%s\n' "$SIGNING_KEY_PEM" > "$RUNNER_TEMP/signing.key")
            echo "EDGEBUILD_SIGNING_KEY=$RUNNER_TEMP/signing.key" >> "$GITHUB_ENV"
          fi
      - name: Build and verify shard ${{ matrix.shard }}
        run: bash ci/edgebuild.sh --shard "$SHARD"
      - name: Keep the lock file this shard wrote (the lock job merges them)
        uses: @UPLOAD_ARTIFACT@
        with:
          name: artifacts-lock-shard-${{ matrix.shard }}
          path: artifacts.lock
          if-no-files-found: ignore
          retention-days: 7
      - name: Hand the builds to the gather job
        if: env.TRUSTED_BUILD == 'true' && vars.EDGEBUILD_REMOTE_CACHE == ''
        uses: @UPLOAD_ARTIFACT@
        with:
          name: edgebuild-remote-shard-${{ matrix.shard }}
          path: ${{ runner.temp }}/edgebuild-remote
          if-no-files-found: ignore
          retention-days: 1

  lock:
    name: the lock file
    needs: shard
    runs-on: ubuntu-latest
    timeout-minutes: 15
    steps:
@SET_UP@
      - uses: @DOWNLOAD_ARTIFACT@
        with:
          pattern: artifacts-lock-shard-*
          path: ${{ runner.temp }}/shard-locks
      - name: One lock file from the shards'; fail when the committed one differs
        run: mkdir -p "$RUNNER_TEMP/shard-locks" && bash ci/edgebuild.sh --lock "$RUNNER_TEMP/shard-locks"
      # The lock file to commit when the step above failed: frozen runs pull by the committed one.
      - name: Keep the merged lock file
        if: always()
        uses: @UPLOAD_ARTIFACT@
        with:
          name: artifacts-lock
          path: artifacts.lock
          if-no-files-found: ignore
          retention-days: 30

  gather:
    name: gather and publish
    needs: [shard, lock]
    # Pull requests push nothing to gather: their shards are the check.
    if: github.event_name == 'push' && github.ref == 'refs/heads/main'
    runs-on: ubuntu-latest
    timeout-minutes: 60
    # Where the signing key is kept (see the shard job).
    environment: edgebuild-signing
    env:
      EDGEBUILD_PUBLISH_TO: ${{ vars.EDGEBUILD_PUBLISH_TO }}
    steps:
@SET_UP@
      - name: The builds the shards handed over
        if: vars.EDGEBUILD_REMOTE_CACHE == ''
        uses: @DOWNLOAD_ARTIFACT@
        with:
          pattern: edgebuild-remote-shard-*
          merge-multiple: true
          path: ${{ runner.temp }}/edgebuild-remote
      - name: Remote cache; sign releases
        env:
          SIGNING_KEY_PEM: ${{ secrets.EDGEBUILD_SIGNING_KEY }}
        run: |
          remote=${SHARED_REMOTE_CACHE:-$RUNNER_TEMP/edgebuild-remote}
          if [ -z "$SHARED_REMOTE_CACHE" ]; then mkdir -p "$remote"; fi
          echo "EDGEBUILD_REMOTE_CACHE=$remote" >> "$GITHUB_ENV"
          if [ -n "$SIGNING_KEY_PEM" ]; then
            (umask 077 && printf '%s\n' "$SIGNING_KEY_PEM" > "$RUNNER_TEMP/signing.key")
            echo "EDGEBUILD_SIGNING_KEY=$RUNNER_TEMP/signing.key" >> "$GITHUB_ENV"
          fi
      # --pull-only fingerprints from the checkpoints; EDGEBUILD_FROZEN=1 (with a trusted
      # key and a committed artifacts.lock) pulls by the lock and needs none.
      - name: Download the hf checkpoints
        if: vars.EDGEBUILD_FROZEN != '1'
        run: bash ci/edgebuild.sh --download
      - name: Gather (pull and check every artifact), publish
        env:
          EDGEBUILD_FROZEN: ${{ vars.EDGEBUILD_FROZEN }}
        run: bash ci/edgebuild.sh --gather
'''.replace("@SET_UP@", _SET_UP).replace("@CACHE@", CACHE).replace("@UPLOAD_ARTIFACT@", UPLOAD_ARTIFACT).replace(
    "@DOWNLOAD_ARTIFACT@", DOWNLOAD_ARTIFACT)


def ci_files(kind: str) -> dict[str, tuple[str, str | None]]:
    """Relative path -> (what it is, its text) for ``init --ci KIND``; ``None`` for
    ``ci/requirements.txt``, whose text depends on the installation
    (:func:`requirements_text`)."""
    files: dict[str, tuple[str, str | None]] = {
        REQUIREMENTS_FILE: ("what CI installs", None),
        SCRIPT_FILE: ("the CI steps script", SCRIPT),
    }
    if kind == "github":
        files[WORKFLOW_FILE] = ("a GitHub Actions workflow", WORKFLOW)
    return files


# A requirement as ``--requirement`` takes it: a name, extras, then a version or ``@ URL``.
_REQUIREMENT = re.compile(r"\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[(?P<extras>[^\]]*)\])?\s*(?P<rest>\S.*)?")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The extra a verify setting needs on a runner, as the manifest writes it.
DATASET_EXTRA = "datasets"


def manifest_extras(manifest: Any) -> dict[str, str]:
    """Extra -> where the manifest needs it, beyond its kinds': a dataset gate on a built-in
    set (scikit-image's photos, scikit-learn's digits) needs the ``datasets`` extra."""
    from edgebuild.core.thresholds import dataset_gate

    needed: dict[str, str] = {}
    for name, params in manifest.artifacts.items():
        gate = dataset_gate(params)
        if gate is not None and gate.builtin:
            needed.setdefault(DATASET_EXTRA, f"artifacts -> {name} -> verify -> dataset (builtin: {gate.builtin})")
    return needed


def missing_extras(text: str, needed: dict[str, str]) -> list[str]:
    """The lines saying which of ``needed`` (extra -> why) the edgebuild requirement of the
    requirements file ``text`` lacks; empty when it has them all, or names no edgebuild."""
    for line in text.splitlines():
        match = _REQUIREMENT.fullmatch(line.split("#", 1)[0]) if line.strip() and not line.lstrip().startswith("#") else None
        if match is None or _normalized(match["name"]) != "edgebuild":
            continue
        named = {extra.strip() for extra in (match["extras"] or "").split(",") if extra.strip()}
        return [f"{REQUIREMENTS_FILE}: edgebuild is installed without the extra {extra!r}, which {why} needs on a "
                f"runner; add it (edgebuild[...,{extra}]), or write the file again from the manifest: python -m "
                "edgebuild init --ci github --refresh-requirements"
                for extra, why in sorted(needed.items()) if extra not in named]
    return []


def requirements_text(kinds: Iterable[str], given: Iterable[str] = (), more_extras: Iterable[str] = ()) -> str:
    """``ci/requirements.txt`` for a project whose manifest uses ``kinds``: edgebuild with
    the extras those kinds need (and ``sign``, and ``more_extras``: what the manifest's
    verify settings need, :func:`manifest_extras`), and the distribution of each plugin kind,
    each pinned as this machine installed it unless ``given`` (lines of a requirements
    file, ``NAME @ URL`` or ``NAME==VERSION``) says where a runner gets it.
    :class:`InitError` for a distribution a runner cannot reach (a local directory)."""
    from edgebuild.core.registry import declarations, get_kind

    extras = set(ALWAYS_EXTRAS) | set(more_extras)
    distributions = {"edgebuild": "edgebuild"}
    known = declarations()
    for name in kinds:
        declaration = known.get(name)
        if declaration is None:
            continue
        if declaration.distribution is not None:
            distributions.setdefault(_normalized(declaration.distribution[0]), declaration.distribution[0])
            continue
        starter = get_kind(name).starter
        if starter is not None and starter.extra:
            extras.add(starter.extra)
    chosen: dict[str, str] = {}
    for line in given:
        match = _REQUIREMENT.fullmatch(line)
        if match is None or not match["rest"]:
            raise InitError(f"--requirement: expected a line of a requirements file naming where a runner installs a "
                            f"package (NAME @ URL, or NAME==VERSION from a package index), found {line!r}")
        chosen[_normalized(match["name"])] = line.strip()
    lines = []
    for key, distribution in distributions.items():
        line = chosen.pop(key, None) or _as_installed(distribution)
        lines.append(_with_extras(line, extras) if key == "edgebuild" else line)
    lines += chosen.values()
    return (
        "# What CI installs (python3 -m pip install -r ci/requirements.txt), written by\n"
        "# `python -m edgebuild init --ci`: edgebuild with the extras this project's kinds need,\n"
        "# and the package each plugin kind comes from. Pin each one: the cache key and every\n"
        "# fingerprint follow the installed versions. Add a kind's package here with the kind.\n"
        + "".join(line + "\n" for line in lines)
    )


def _with_extras(line: str, extras: set[str]) -> str:
    """The requirement ``line`` with ``extras`` added to those it names."""
    match = _REQUIREMENT.fullmatch(line)
    assert match is not None
    named = {extra.strip() for extra in (match["extras"] or "").split(",") if extra.strip()}
    rest = (match["rest"] or "").strip()
    if rest.startswith("@"):
        rest = f" @ {rest[1:].strip()}"
    return f"{match['name']}[{','.join(sorted(named | extras))}]{rest}"


def _as_installed(distribution: str) -> str:
    """The requirement that installs ``distribution`` as this machine has it (PEP 610's
    ``direct_url.json`` says how it came): a version from an index, a VCS commit, an
    archive's URL. :class:`InitError` when a runner cannot reach where it came from."""
    try:
        found = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise InitError(f"--ci: {distribution} is not installed here; give --requirement for it") from None
    text = found.read_text("direct_url.json")
    if not text:
        return f"{found.metadata['Name']}=={found.version}"
    try:
        direct = json.loads(text)
        url = direct["url"]
    except (ValueError, KeyError, TypeError):
        direct, url = {}, ""
    name = found.metadata["Name"]
    vcs = direct.get("vcs_info") if isinstance(direct.get("vcs_info"), dict) else None
    if vcs and vcs.get("commit_id") and not url.startswith("file:"):
        subdirectory = f"#subdirectory={direct['subdirectory']}" if direct.get("subdirectory") else ""
        return f"{name} @ {vcs.get('vcs', 'git')}+{url}@{vcs['commit_id']}{subdirectory}"
    if "archive_info" in direct and url.startswith(("https://", "http://")):
        return f"{name} @ {url}"
    raise InitError(
        f"--ci: {name} {found.version} was installed from {url or 'a place direct_url.json does not say'}, which a CI "
        f"runner cannot reach; say where a runner installs it: --requirement '{name} @ git+https://HOST/ORG/REPO@TAG' "
        f"(a git URL, a wheel's URL, or {name}==VERSION from your package index)"
    )
