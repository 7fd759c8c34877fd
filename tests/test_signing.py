"""Who can make a runner believe an artifact is verified: only holders of a trusted key.

A remote entry whose weights were changed, with its digests and build record rewritten
to agree (the fingerprint covers inputs, not outputs) and the original passing report
kept, is consistent: every check of ``remote.py`` passes. It must still never count as
verified unless a trusted key signed it. Against a directory and the real S3 API
(moto's server on loopback), in process and through the real doit CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgebuild.cache.location import Location
from edgebuild.cache.entries import blob_key, entry_key
from edgebuild.cache.remote import RemoteCache
from edgebuild.cache.signing import Trust, key_id, load_public_key
from edgebuild.cache.store import Store
from edgebuild.core.hashing import canonical_json, digest_bytes
from edgebuild.core.record import RECORD_FILE
from edgebuild.errors import ConfigError, UnvouchedEntry

from helpers import clone_project, fresh_clone, signer, trusting
from test_remote_cache import stored_build

TOWER = "t"


@pytest.fixture
def remote_url(remote_url: str) -> str:
    if "://" not in remote_url:
        Path(remote_url).mkdir()
    return remote_url


# --- keys --------------------------------------------------------------------------------


def test_keygen_writes_a_pair_whose_private_half_only_its_owner_reads(tmp_path: Path) -> None:
    made = subprocess.run([sys.executable, "-m", "edgebuild", "keygen", str(tmp_path / "ci")],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "ci.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "ci.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----\n")
    shown = key_id(load_public_key(tmp_path / "ci.pub"))[:16]
    assert made.stdout.splitlines()[-1] == f"key id {shown}"
    before = (tmp_path / "ci.key").read_bytes()
    again = subprocess.run([sys.executable, "-m", "edgebuild", "keygen", str(tmp_path / "ci")],
                           capture_output=True, text=True, timeout=120)
    assert (again.returncode, again.stdout) == (2, "")
    assert again.stderr == f"edgebuild: error: {tmp_path / 'ci.key'}: exists already; keygen never overwrites a key (choose another PREFIX)\n"
    assert (tmp_path / "ci.key").read_bytes() == before


@pytest.mark.parametrize("content, expected", [
    (b"not a key\n", "expected a PEM public key of ECDSA P-256"),
    (None, "expected a PEM public key of ECDSA P-256 (that is the private key: name PREFIX.pub)"),
])
def test_a_trusted_key_that_is_not_a_public_key_is_one_line(content: bytes | None, expected: str, keys: dict[str, Path],
                                                             tmp_path: Path) -> None:
    from edgebuild.core.config import Settings

    path = tmp_path / "trusted.pub"
    path.write_bytes(content if content is not None else Path(f"{keys['team']}.key").read_bytes())
    settings = Settings.from_environ({"EDGEBUILD_TRUSTED_KEYS": f"{keys['team']}.pub,{path}"})
    with pytest.raises(ConfigError) as raised:
        Trust.from_settings(settings)
    assert str(raised.value) == f"EDGEBUILD_TRUSTED_KEYS: {path}: {expected}"


def _copied(key: Path, folder: Path, name: str, mode: int, folder_mode: int = 0o700) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_bytes(key.read_bytes())
    path.chmod(mode)
    folder.chmod(folder_mode)
    return path


@pytest.mark.parametrize("variable, mode, folder_mode, expected", [
    ("EDGEBUILD_SIGNING_KEY", 0o644, 0o700, "mode 0644 lets others than its owner read or write the private key; "
     "refused, as ssh refuses such a key (chmod 600 {path})"),
    ("EDGEBUILD_SIGNING_KEY", 0o640, 0o700, "mode 0640 lets others than its owner read or write the private key; "
     "refused, as ssh refuses such a key (chmod 600 {path})"),
    ("EDGEBUILD_TRUSTED_KEYS", 0o666, 0o755, "mode 0666 lets others than its owner rewrite a trusted key, and with "
     "it what counts as verified here; refused, as ssh refuses such a key (chmod go-w {path})"),
    # Group-writable too (issue 60): ssh refuses an authorized_keys its group may rewrite.
    ("EDGEBUILD_TRUSTED_KEYS", 0o664, 0o755, "mode 0664 lets others than its owner rewrite a trusted key, and with "
     "it what counts as verified here; refused, as ssh refuses such a key (chmod go-w {path})"),
    ("EDGEBUILD_TRUSTED_KEYS", 0o644, 0o777, "its directory {folder} (mode 0777) lets anyone replace the trusted key; "
     "refused (chmod o-w {folder})"),
    # A sticky directory (as /tmp) lets no one replace another's file; a group-writable
    # checkout's directory (umask 002) is the group's business; the owner alone may read a
    # private key.
    ("EDGEBUILD_TRUSTED_KEYS", 0o644, 0o1777, None),
    ("EDGEBUILD_TRUSTED_KEYS", 0o644, 0o775, None),
    ("EDGEBUILD_SIGNING_KEY", 0o600, 0o755, None),
    ("EDGEBUILD_SIGNING_KEY", 0o400, 0o700, None),
])
def test_a_key_anyone_else_may_read_or_rewrite_is_refused(variable: str, mode: int, folder_mode: int,
                                                         expected: str | None, keys: dict[str, Path],
                                                         tmp_path: Path) -> None:
    from edgebuild.core.config import Settings

    suffix = ".key" if variable == "EDGEBUILD_SIGNING_KEY" else ".pub"
    folder = tmp_path / "keys"
    path = _copied(Path(f"{keys['team']}{suffix}"), folder, f"ci{suffix}", mode, folder_mode)
    try:
        settings = Settings.from_environ({variable: str(path)})
        if expected is None:
            trust = Trust.from_settings(settings)
            assert list(trust.trusted) == [key_id(load_public_key(Path(f"{keys['team']}.pub")))]
            return
        with pytest.raises(ConfigError) as raised:
            Trust.from_settings(settings)
        assert str(raised.value) == f"{variable}: {path}: " + expected.format(path=path, folder=folder)
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize("variable, suffix", [("EDGEBUILD_TRUSTED_KEYS", ".pub"), ("EDGEBUILD_SIGNING_KEY", ".key")])
def test_a_key_file_of_several_pem_blocks_is_refused(variable: str, suffix: str, keys: dict[str, Path],
                                                     tmp_path: Path) -> None:
    """One key per file: trusting only the first block was silent; trusting all would make
    cache entries and releases (model-signing reads one key per file) disagree."""
    from edgebuild.core.config import Settings

    path = tmp_path / f"both{suffix}"
    path.write_bytes(Path(f"{keys['team']}{suffix}").read_bytes() + Path(f"{keys['other']}{suffix}").read_bytes())
    path.chmod(0o600)
    with pytest.raises(ConfigError) as raised:
        Trust.from_settings(Settings.from_environ({variable: str(path)}))
    assert str(raised.value) == (f"{variable}: {path}: holds 2 PEM blocks; expected one key per file (put each key in "
                                 "a file of its own and list every file, comma-separated)")


@pytest.mark.parametrize("make, found", [
    (os.mkfifo, "a FIFO (named pipe), not a regular file"),
    (os.mkdir, "a directory, not a regular file"),
])
def test_a_trusted_key_that_is_a_fifo_or_a_directory_is_one_line_at_once(make, found: str, tmp_path: Path) -> None:
    """Read through the bounded reader: a FIFO is refused, never waited on (it hung)."""
    path = tmp_path / "keys.pub"
    make(path)
    result = subprocess.run([sys.executable, "-m", "edgebuild", "fetch", "t", "--from", str(tmp_path / "nowhere"),
                             "--to", str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "EDGEBUILD_TRUSTED_KEYS": str(path)})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"edgebuild: error: EDGEBUILD_TRUSTED_KEYS: {path}: {found}; expected a PEM key file\n"
    assert not (tmp_path / "out").exists()


def test_an_empty_path_among_the_trusted_keys_is_an_error() -> None:
    from edgebuild.core.config import Settings

    with pytest.raises(ConfigError, match=r"EDGEBUILD_TRUSTED_KEYS: expected paths separated by commas, found an empty one"):
        Settings.from_environ({"EDGEBUILD_TRUSTED_KEYS": "a.pub,,b.pub"})


# --- entries, in process -------------------------------------------------------------------


def test_a_signed_entry_is_pulled_with_its_report(remote_url: str, keys: dict[str, Path], tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    messages: list[str] = []
    assert RemoteCache.open(remote_url, trust=signer(keys["team"])).push(fingerprint, store, messages.append)
    assert re.fullmatch(rf"remote cache: pushed {fingerprint[:12]} to \S+ \(4 files, signed by key [0-9a-f]{{16}}\)",
                        messages[0]), messages
    other = Store(tmp_path / "b" / "store")
    pulled = RemoteCache.open(remote_url, trust=trusting(keys["team"])).pull(
        "artifact", fingerprint, other, tmp_path / "b" / "artifact", tmp_path / "b" / "tmp", messages.append,
        vouched_only=True,
    )
    assert pulled is not None and pulled.fingerprint == fingerprint
    assert (tmp_path / "b" / "artifact" / "report.json").is_file() and other.unvouched(fingerprint) is None
    # Which key it was taken under: it counts while that key is trusted (run/state.py).
    assert other.vouched_by(fingerprint) == {"key": key_id(load_public_key(Path(f"{keys['team']}.pub"))),
                                             "from": remote_url}
    # Judged here, it is this runner's verdict: the note goes.
    other.put_report(fingerprint, tmp_path / "b" / "artifact")
    assert other.vouched_by(fingerprint) is None


def poison(location: Location, fingerprint: str, sign_with: Trust | None = None, keep_signature: bool = True) -> None:
    """What someone who can write the bucket does: new bytes for ``model.bin``, the
    record's outputs and the entry's digests rewritten to agree, the passing report kept."""
    entry = json.loads(location.read(entry_key(fingerprint)))
    weights = bytes(255 - byte for byte in location.read(blob_key(entry["files"]["model.bin"]["digest"])))
    record = json.loads(location.read(blob_key(entry["files"][RECORD_FILE]["digest"])))
    record["outputs"]["model.bin"] = {"size": len(weights), "digest": digest_bytes(weights)}
    record_bytes = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    for data in (weights, record_bytes):
        location.write(blob_key(digest_bytes(data)), data)
    entry["files"]["model.bin"] = {"size": len(weights), "digest": digest_bytes(weights)}
    entry["files"][RECORD_FILE] = {"size": len(record_bytes), "digest": digest_bytes(record_bytes)}
    if not keep_signature:
        entry.pop("signature", None)
    if sign_with is not None:
        entry = sign_with.sign(entry)
    location.write(entry_key(fingerprint), (canonical_json(entry) + "\n").encode())


@pytest.mark.parametrize("attack, why", [
    ("unsigned", "it is unsigned"),
    ("signed by another key", r"it is signed by key [0-9a-f]{16}, which is not a trusted key \(EDGEBUILD_TRUSTED_KEYS\)"),
    ("signature kept", r"its signature by key [0-9a-f]{16} does not match the entry"),
])
def test_a_poisoned_entry_is_a_build_never_a_verification(attack: str, why: str, remote_url: str,
                                                          keys: dict[str, Path], tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    remote = RemoteCache.open(remote_url, trust=signer(keys["team"]))
    remote.push(fingerprint, store, lambda message: None)
    poison(remote.location, fingerprint, sign_with=signer(keys["other"]) if attack == "signed by another key" else None,
           keep_signature=attack == "signature kept")

    # Consistent: every digest and the record agree, so a pull takes it -- as a build.
    gather = RemoteCache.open(remote_url, trust=trusting(keys["team"]))
    other = Store(tmp_path / "b" / "store")
    with pytest.raises(UnvouchedEntry, match=rf"^artifact: the build of {fingerprint[:12]} in \S+ is not taken as verified: {why}; "
                                             r"--pull-only takes only builds signed by a trusted key"):
        gather.pull("artifact", fingerprint, other, tmp_path / "b" / "artifact", tmp_path / "b" / "tmp",
                    lambda message: None, vouched_only=True)
    assert not (tmp_path / "b" / "artifact").exists() and not other.has(fingerprint)

    messages: list[str] = []
    pulled = gather.pull("artifact", fingerprint, other, tmp_path / "b" / "artifact", tmp_path / "b" / "tmp", messages.append)
    assert pulled is not None
    assert not (tmp_path / "b" / "artifact" / "report.json").exists() and not other.has_report(fingerprint, "")
    assert re.fullmatch(rf"pulled from \S+: {why}", other.unvouched(fingerprint))
    assert re.fullmatch(rf"remote cache: {fingerprint[:12]} is pulled as a build, not as verified \({why}\); "
                        "verification judges it here", messages[-1]), messages

    # A runner that signs replaces what nobody it trusts signed; one that does not, leaves it.
    assert RemoteCache.open(remote_url).takes_pushes(fingerprint) is False
    assert remote.takes_pushes(fingerprint) is True
    replaced: list[str] = []
    assert remote.push(fingerprint, store, replaced.append)
    assert replaced[-1].endswith("(replacing an entry no trusted key signed)")
    assert gather.trust.distrust(remote.entry(fingerprint)) is None
    assert remote.takes_pushes(fingerprint) is False


def test_with_no_trusted_key_every_pulled_entry_is_judged_here(remote_url: str, keys: dict[str, Path], tmp_path: Path) -> None:
    store, fingerprint = stored_build(tmp_path / "a")
    RemoteCache.open(remote_url, trust=signer(keys["team"])).push(fingerprint, store, lambda message: None)
    other = Store(tmp_path / "b" / "store")
    RemoteCache.open(remote_url).pull("artifact", fingerprint, other, tmp_path / "b" / "artifact", tmp_path / "b" / "tmp",
                                      lambda message: None)
    assert re.fullmatch(r"pulled from \S+: it is signed by key [0-9a-f]{16}, and no key is trusted here "
                        r"\(EDGEBUILD_TRUSTED_KEYS\)", other.unvouched(fingerprint))


# --- through the real doit CLI ---------------------------------------------------------------


def negate_second_half(path: Path) -> None:
    """The tower's weights (float32 external data) with their second half negated."""
    values = np.fromfile(path, dtype=np.float32)
    values[len(values) // 2:] *= -1
    values.tofile(path)


def poison_the_tower(remote: RemoteCache, fingerprint: str, scratch: Path) -> None:
    """The attack of issue 22, on a real build: the weights' second half negated, the
    record's outputs and the entry's digests rewritten to match, the report kept, the
    signature kept (it no longer matches)."""
    location = remote.location
    entry = json.loads(location.read(entry_key(fingerprint)))
    scratch.mkdir()
    data = scratch / "model.onnx.data"
    location.download(blob_key(entry["files"]["model.onnx.data"]["digest"]), data)
    negate_second_half(data)
    weights = data.read_bytes()
    record = json.loads(location.read(blob_key(entry["files"][RECORD_FILE]["digest"])))
    meta = {"size": len(weights), "digest": digest_bytes(weights)}
    record["outputs"]["model.onnx.data"] = meta
    record_bytes = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    for blob in (weights, record_bytes):
        location.write(blob_key(digest_bytes(blob)), blob)
    entry["files"]["model.onnx.data"] = meta
    entry["files"][RECORD_FILE] = {"size": len(record_bytes), "digest": digest_bytes(record_bytes)}
    location.write(entry_key(fingerprint), (canonical_json(entry) + "\n").encode())


@pytest.mark.slow
@pytest.mark.workflow
def test_a_poisoned_tower_is_refused_by_a_gather_and_replaced_by_a_signing_runner(
    verified_seed: Path, keys: dict[str, Path], tmp_path: Path
) -> None:
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    remote = str(remote_dir)
    ci = {"EDGEBUILD_REMOTE_CACHE": remote, "EDGEBUILD_SIGNING_KEY": f"{keys['team']}.key"}
    gather_env = {"EDGEBUILD_REMOTE_CACHE": remote, "EDGEBUILD_TRUSTED_KEYS": f"{keys['team']}.pub"}

    # The protected branch's runner verifies and pushes, signed.
    first = clone_project(verified_seed, tmp_path / "ci")
    fingerprint = first.project().artifact(TOWER).fingerprint
    pushed = first.doit("verify", env=ci)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert re.search(rf"\[t\] remote cache: pushed {fingerprint[:12]} to {re.escape(remote)} \(7 files, signed by key ", pushed.stderr)

    # An honest signed entry: a gather that trusts the key pulls it and judges nothing.
    honest = fresh_clone(verified_seed, tmp_path / "honest")
    pulled = honest.doit("verify", "--pull-only", env=gather_env)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert f"[t] pulled from the remote cache {remote} in " in pulled.stderr
    assert "-- verify:t\n" in pulled.stdout and "# t (qwen3_5_vision_tower)" not in pulled.stderr

    poison_the_tower(RemoteCache.open(remote), fingerprint, tmp_path / "attack")

    # A gather that trusts the team's key: one line naming the artifact and why; nothing written.
    gather = fresh_clone(verified_seed, tmp_path / "gather")
    refused = gather.doit("verify", "--pull-only", env=gather_env)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert re.search(rf"t: the build of {fingerprint[:12]} in {re.escape(remote)} is not taken as verified: its signature by "
                     r"key [0-9a-f]{16} does not match the entry; --pull-only takes only builds signed by a trusted key", output), output
    assert "Traceback" not in output and not (gather.root / "build" / TOWER).exists()
    status = gather.doit("status", env=gather_env)
    assert "verified" not in status.stdout.replace("not verified", ""), status.stdout

    # A gather with no trusted key judges the pulled build here: it fails, and nothing is exported.
    keyless = fresh_clone(verified_seed, tmp_path / "keyless")
    judged = keyless.doit("verify", "--pull-only", env={"EDGEBUILD_REMOTE_CACHE": remote, "EDGEBUILD_REMOTE_CACHE_READONLY": "1"})
    output = judged.stdout + judged.stderr
    assert judged.returncode != 0
    assert "# t (qwen3_5_vision_tower): FAILED" in judged.stderr
    assert "(the build was pulled: pulled from " in output and "--pull-only exports nothing)" in output
    assert "built in" not in judged.stderr and "Traceback" not in output
    assert "verified" not in keyless.doit("status").stdout.replace("not verified", "")

    # The signing runner without --pull-only: pulled, judged here, failed, thrown away,
    # exported here, verified, and pushed signed in place of the poisoned entry.
    repair = fresh_clone(verified_seed, tmp_path / "repair")
    repaired = repair.doit("verify", env=ci)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "[t] the pulled build failed verification here (pulled from " in repaired.stderr
    assert "[t] built in" in repaired.stderr and "# t (qwen3_5_vision_tower): PASSED" in repaired.stderr
    assert f"[t] remote cache: pushed {fingerprint[:12]} to {remote} (7 files, signed by key " in repaired.stderr
    assert (repair.root / "build" / TOWER / "model.onnx.data").read_bytes() == (
        first.root / "build" / TOWER / "model.onnx.data").read_bytes()
    again = fresh_clone(verified_seed, tmp_path / "again")
    trusted = again.doit("verify", "--pull-only", env=gather_env)
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert "-- verify:t\n" in trusted.stdout


@pytest.mark.slow
def test_a_bad_key_setting_stops_the_command_before_any_task_runs(verified_seed: Path, keys: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """A private key named as trusted: one line naming the variable and file, before
    anything is judged or written (the report of the built `t` is untouched)."""
    project = clone_project(verified_seed, tmp_path / "p")
    (tmp_path / "remote").mkdir()
    report = project.root / "build" / "t" / "report.json"
    before = report.read_bytes()
    result = project.doit("verify", env={"EDGEBUILD_REMOTE_CACHE": str(tmp_path / "remote"),
                                         "EDGEBUILD_TRUSTED_KEYS": f"{keys['team']}.key"})
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert (f"EDGEBUILD_TRUSTED_KEYS: {keys['team']}.key: expected a PEM public key of ECDSA P-256 (that is the "
            "private key: name PREFIX.pub)") in output, output
    assert "Traceback" not in output and "# t (" not in output and "TaskFailed" not in output
    assert report.read_bytes() == before
