"""Signed releases: what a published entry says about itself, and who vouches for it.

Each published entry carries, beside ``provenance.json``:

- ``provenance.intoto.json``: an in-toto Statement (v1) with a SLSA Provenance (v1)
  predicate. Its subjects are the entry's files by sha256 (outputs and reports); its
  resolved dependencies are what the build read -- each checkpoint by its Hugging Face
  repo and commit when it came from the Hub, else by the content digest edgebuild
  fingerprints it by; the input files and sources by theirs -- and the source commit;
  the builder records edgebuild's and the tools' versions.
- ``model.sig``: an OpenSSF ``model-signing`` signature (a Sigstore bundle holding a
  DSSE envelope, key-based and offline) over every other file of the entry, made with
  the runner's ``EDGEBUILD_SIGNING_KEY`` -- the same ECDSA P-256 pair that signs cache
  entries. ``model_signing verify key --public_key ci.pub`` checks it without edgebuild.

``SHA256SUMS``, written last, lists both, so the index's checksum covers them too.
Signing needs the ``sign`` extra (``pip install 'edgebuild[sign]'``).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from edgebuild.cache.signing import load_private_key, load_public_key
from edgebuild.errors import PublishError

SIGNATURE_FILE = "model.sig"
STATEMENT_FILE = "provenance.intoto.json"
# Files of an entry that a signature does not cover: itself, and the list of checksums
# written after it (which lists the signature).
UNSIGNED_FILES = (SIGNATURE_FILE, "SHA256SUMS")
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:edgebuild:build:v1"
BUILDER_ID = "urn:edgebuild:publish"
NEEDS_EXTRA = "release signing needs the 'sign' extra: pip install 'edgebuild[sign]'"


def _model_signing() -> Any:
    try:
        import model_signing
        from model_signing import hashing, signing, verifying  # noqa: F401 - the package's own layout
    except ImportError as error:
        raise PublishError(f"{NEEDS_EXTRA} ({error})") from None
    return model_signing


def statement(provenance: dict[str, Any], subjects: dict[str, str]) -> dict[str, Any]:
    """The in-toto statement of one entry: ``subjects`` is file -> sha256 (the entry's
    files but the statement and the signature), ``provenance`` the entry's provenance.json."""
    dependencies: list[dict[str, Any]] = []
    origins = provenance.get("checkpoint_origins") or {}
    for role, inputs in sorted((provenance.get("inputs") or {}).items()):
        origin = origins.get(role)
        if origin:
            dependencies.append({
                "name": role,
                "uri": f"hf://{origin['hf']}@{origin['commit']}",
                "digest": {"gitCommit": origin["commit"]},
                "annotations": {"revision": origin["revision"], "files": origin["files"]},
            })
        else:
            from edgebuild.core.hashing import digest_json

            # A checkpoint by path, an input file list, a source's outputs: by the digest
            # the fingerprint covers them by (blake3 of their canonical JSON).
            dependencies.append({"name": role, "digest": {"blake3": digest_json(inputs)}})
    git = provenance.get("git") or {}
    if git.get("commit"):
        dependencies.append({
            "name": "source",
            "digest": {"gitCommit": git["commit"]},
            "annotations": {"dirty": git.get("dirty"), "allow_dirty": git.get("allow_dirty")},
        })
    manifest = provenance.get("manifest") or {}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": digest}} for name, digest in sorted(subjects.items())],
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "artifact": provenance.get("artifact"),
                    "manifest": manifest.get("file"),
                    "entry": manifest.get("entry"),
                    "kind": provenance.get("kind"),
                    "params": provenance.get("params"),
                },
                "internalParameters": {
                    "fingerprint": provenance.get("fingerprint"),
                    "verify_fingerprint": (provenance.get("verification") or {}).get("verify_fingerprint"),
                    "code": provenance.get("code"),
                    "verify_code": provenance.get("verify_code"),
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {
                    "id": BUILDER_ID,
                    "version": {"edgebuild": provenance.get("edgebuild_version"), **(provenance.get("versions") or {})},
                },
                "metadata": {"invocationId": provenance.get("fingerprint")},
            },
        },
    }


def _lay_out(files: dict[str, bytes | Path], directory: Path) -> None:
    for relative, content in files.items():
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            try:
                os.link(content, target)  # read only: hashing a link costs no copy
            except OSError:
                shutil.copyfile(content, target)


def _hashing(model_signing: Any) -> Any:
    return model_signing.hashing.Config().set_ignored_paths(paths=list(UNSIGNED_FILES), ignore_git_paths=False)


def sign_entry(files: dict[str, bytes | Path], private_key: Path, scratch_root: Path) -> bytes:
    """``model.sig`` for an entry made of ``files`` (file -> bytes or a local file)."""
    # model-signing reads the key file itself: checked here first (bounded, one key, mode).
    load_private_key(private_key)
    model_signing = _model_signing()
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="release~", dir=scratch_root))
    try:
        entry = scratch / "entry"
        _lay_out(files, entry)
        signature = scratch / SIGNATURE_FILE
        try:
            (model_signing.signing.Config().use_elliptic_key_signer(private_key=str(private_key))
             .set_hashing_config(_hashing(model_signing)).sign(str(entry), str(signature)))
        except (ValueError, OSError) as error:
            raise PublishError(f"EDGEBUILD_SIGNING_KEY: {private_key}: cannot sign the release ({error})") from None
        return signature.read_bytes()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def release_distrust(directory: Path, trusted_keys: list[str]) -> str | None:
    """Why the entry downloaded to ``directory`` is not a release signed by one of
    ``trusted_keys`` (public key paths); ``None`` when one key's signature covers
    exactly its files, byte for byte."""
    if not (directory / SIGNATURE_FILE).is_file():
        return f"it is unsigned (no {SIGNATURE_FILE})"
    if not trusted_keys:
        return "no key is trusted here to check its signature against (EDGEBUILD_TRUSTED_KEYS)"
    model_signing = _model_signing()
    reasons = []
    for key in trusted_keys:
        load_public_key(Path(key))
        try:
            (model_signing.verifying.Config().use_elliptic_key_verifier(public_key=key)
             .set_hashing_config(_hashing(model_signing)).verify(str(directory), str(directory / SIGNATURE_FILE)))
            return None
        except Exception as error:  # model-signing raises ValueError and its own kinds
            reasons.append(f"{Path(key).name}: {_verification_failure(error)}")
    return "its signature does not verify with any trusted key (" + "; ".join(reasons) + ")"


# Names of files shown in a failure, per kind of difference; the rest are counted.
FILES_SHOWN = 5
# A failure model-signing words otherwise is cut at a word, to this many characters.
FAILURE_CHARS = 160


def _verification_failure(error: Exception) -> str:
    """model-signing's failure as one readable clause: for a signature that does not
    cover the files, which files were changed, added or are missing (model-signing words
    it as the repr of a list of messages, with digests, that a cut leaves mid-escape)."""
    text = str(error).strip()
    prefix = "Signature mismatch: "
    if text.startswith(prefix):
        try:
            differences = ast.literal_eval(text[len(prefix):])
        except (ValueError, SyntaxError):
            differences = None
        if isinstance(differences, list) and all(isinstance(item, str) for item in differences):
            return _files_differ(differences)
    first = text.splitlines()[0] if text else type(error).__name__
    return first if len(first) <= FAILURE_CHARS else first[:FAILURE_CHARS].rsplit(" ", 1)[0] + " ..."


def _files_differ(differences: list[str]) -> str:
    changed: list[str] = []
    listed: dict[str, list[str]] = {"not signed": [], "signed but missing": []}
    for item in differences:
        mismatch = re.match(r"Hash mismatch for '(.*?)': Expected ", item)
        if mismatch:
            changed.append(mismatch.group(1))
            continue
        for pattern, said in ((r"Extra files found in model '.*?': ", "not signed"),
                              (r"Missing files in model '.*?': ", "signed but missing")):
            found = re.match(pattern, item)
            if found:
                listed[said] += item[found.end():].split(", ")
    parts = [f"{said}: {_named(names)}" for said, names in (("changed since signed", changed), *listed.items()) if names]
    return "the files are not those it signs (" + "; ".join(parts) + ")" if parts else "the files are not those it signs"


def _named(names: list[str]) -> str:
    shown = ", ".join(names[:FILES_SHOWN])
    return shown + (f" and {len(names) - FILES_SHOWN} more" if len(names) > FILES_SHOWN else "")
