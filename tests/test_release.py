"""Signed releases and a consumer's fetch, against a directory and the real S3 API
(moto's server on loopback): `doit publish` with a signing key writes an in-toto SLSA
statement and an OpenSSF model-signing signature; `python -m edgebuild fetch` takes
the latest (or a fingerprint's, or a commit's) build only when every byte matches and a
trusted key signed it, and writes nothing otherwise."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.cache.location import Location
from edgebuild.core.config import Settings
from edgebuild.run.publish import publish
from edgebuild.run.workspace import Workspace

from helpers import clone_project, commit, git, flipped


@pytest.fixture
def remote_url(remote_url: str) -> str:
    if "://" not in remote_url:
        Path(remote_url).mkdir()
    return remote_url


def fetch(*args: str, trusted: Path | None) -> subprocess.CompletedProcess[str]:
    env_keys = {"EDGEBUILD_TRUSTED_KEYS": f"{trusted}.pub"} if trusted is not None else {}
    import os

    environment = {key: value for key, value in os.environ.items() if not key.startswith("EDGEBUILD_TRUSTED")}
    return subprocess.run([sys.executable, "-m", "edgebuild", "fetch", *args], capture_output=True, text=True,
                          timeout=300, env=environment | env_keys)


def published_project(seed: Path, root: Path, destination: str, signing_key: Path | None) -> tuple[Workspace, str]:
    project = clone_project(seed, root)
    commit(project.root, "artifacts.yaml", "dodo.py", message="manifest")
    settings = Settings.from_environ().replace(remote_cache="off",
                                               signing_key=f"{signing_key}.key" if signing_key else None)
    workspace = Workspace.open(project.root / "artifacts.yaml", project.root, settings)
    publish(workspace, [workspace.artifact("t")], destination, log=lambda message: None)
    return workspace, workspace.fingerprint(workspace.artifact("t"))


@pytest.mark.slow
def test_a_signed_release_is_fetched_and_a_tampered_one_is_refused(remote_url: str, verified_seed: Path,
                                                                   keys: dict[str, Path], tmp_path: Path) -> None:
    workspace, fingerprint = published_project(verified_seed, tmp_path / "project", remote_url, keys["team"])
    destination = Location(remote_url)
    index = json.loads(destination.read("index.json"))
    row = index["artifacts"]["t"][fingerprint]
    head = git(workspace.manifest.root, "rev-parse", "HEAD")
    assert index["latest"] == {"t": fingerprint} and row["commit"] == head and row["signed"] is True

    # The in-toto statement: every file by sha256, the source commit among what it read.
    statement = json.loads(destination.read(f"t/{fingerprint}/provenance.intoto.json"))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    built = workspace.artifact("t").directory
    subjects = {subject["name"]: subject["digest"]["sha256"] for subject in statement["subject"]}
    assert subjects["model.onnx.data"] == hashlib.sha256((built / "model.onnx.data").read_bytes()).hexdigest()
    assert {"report.json", "provenance.json"} <= set(subjects) and "model.sig" not in subjects
    dependencies = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert {"name": "source", "digest": {"gitCommit": head}} == {key: dependencies[-1][key] for key in ("name", "digest")}
    assert statement["predicate"]["buildDefinition"]["internalParameters"]["fingerprint"] == fingerprint

    # Fetched: the latest, by fingerprint prefix, by commit; every byte as built.
    fetched = fetch("t", "--from", remote_url, "--to", str(tmp_path / "latest"), trusted=keys["team"])
    assert fetched.returncode == 0, fetched.stderr
    for name in ("model.onnx", "model.onnx.data", "tower.json"):
        assert (tmp_path / "latest" / name).read_bytes() == (built / name).read_bytes()
    assert (tmp_path / "latest" / "model.sig").is_file()
    # ... and model-signing's own CLI, knowing nothing of edgebuild, checks it (as the README says).
    checked = subprocess.run(
        [str(Path(sys.executable).with_name("model_signing")), "verify", "key", "--signature",
         str(tmp_path / "latest" / "model.sig"), "--ignore-paths", str(tmp_path / "latest" / "SHA256SUMS"),
         "--public_key", f"{keys['team']}.pub", str(tmp_path / "latest")],
        capture_output=True, text=True, timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert fetch("t", "--from", remote_url, "--to", str(tmp_path / "by-fp"), "--fingerprint", fingerprint[:10],
                 trusted=keys["team"]).returncode == 0
    assert fetch("t", "--from", remote_url, "--to", str(tmp_path / "by-commit"), "--commit", head[:9],
                 trusted=keys["team"]).returncode == 0
    # The Python API does the same.
    import edgebuild

    assert edgebuild.fetch("t", remote_url, tmp_path / "api", trusted_keys=[f"{keys['team']}.pub"]) == tmp_path / "api"

    def refused(expected: str, trusted: Path | None = keys["team"], *extra: str) -> None:
        target = tmp_path / "refused"
        result = fetch("t", "--from", remote_url, "--to", str(target), *extra, trusted=trusted)
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr.startswith("edgebuild: error: ") and expected in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not target.exists()
        assert [path.name for path in tmp_path.iterdir() if ".fetch~" in path.name] == []

    refused("is not taken: its signature does not verify with any trusted key (other.pub: ", trusted=keys["other"])
    refused("nothing published at", keys["team"], "--commit", "0000000")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "mine.txt").write_text("a user's file\n")
    taken = fetch("t", "--from", remote_url, "--to", str(occupied), trusted=keys["team"])
    assert taken.returncode == 2 and "exists and is not an empty directory; nothing fetched into it" in taken.stderr
    assert [path.name for path in occupied.iterdir()] == ["mine.txt"]

    # A flipped byte: SHA256SUMS says otherwise.
    key = f"t/{fingerprint}/model.onnx.data"
    original = destination.read(key)
    damaged = flipped(original, len(original) // 2, 0x01)
    destination.write(key, damaged)
    refused("model.onnx.data does not match SHA256SUMS; nothing fetched")

    # The same bytes with SHA256SUMS and the index's checksum rewritten to agree (what
    # anyone who can write the bucket can do): only the signature tells.
    sums_key = f"t/{fingerprint}/SHA256SUMS"
    sums = destination.read(sums_key).decode().replace(
        hashlib.sha256(original).hexdigest(), hashlib.sha256(damaged).hexdigest())
    destination.write(sums_key, sums.encode())
    index["artifacts"]["t"][fingerprint]["checksum"] = "sha256:" + hashlib.sha256(sums.encode()).hexdigest()
    destination.write("index.json", json.dumps(index).encode())
    refused("its signature does not verify with any trusted key (team.pub: the files are not those it signs "
            "(changed since signed: model.onnx.data)); nothing fetched")


def test_a_signature_over_other_files_says_which_in_whole_names(tmp_path: Path) -> None:
    """model-signing words a mismatch as the repr of a list of messages with digests; a
    cut at a fixed length left it mid-escape. Each file is named whole, none cut."""
    from edgebuild.cache.signing import generate
    from edgebuild.run.release import SIGNATURE_FILE, release_distrust, sign_entry

    private, public = generate(tmp_path / "k")
    files = {"model.onnx": b"x" * 64, 'odd "name".json': b"{}"}
    signature = sign_entry(files, private, tmp_path)
    release = tmp_path / "release"
    release.mkdir()
    for name, data in files.items():
        (release / name).write_bytes(data)
    (release / SIGNATURE_FILE).write_bytes(signature)
    assert release_distrust(release, [str(public)]) is None
    (release / "model.onnx").write_bytes(b"y" * 64)
    for index in range(7):
        (release / f"extra{index}.bin").write_bytes(b"")
    (release / 'odd "name".json').unlink()
    assert release_distrust(release, [str(public)]) == (
        "its signature does not verify with any trusted key (k.pub: the files are not those it signs (changed since "
        "signed: model.onnx; not signed: extra0.bin, extra1.bin, extra2.bin, extra3.bin, extra4.bin and 2 more; "
        'signed but missing: odd "name".json))'
    )


@pytest.mark.slow
def test_an_unsigned_release_is_refused(verified_seed: Path, keys: dict[str, Path], tmp_path: Path) -> None:
    destination = tmp_path / "published"
    destination.mkdir()
    _, fingerprint = published_project(verified_seed, tmp_path / "project", str(destination), signing_key=None)
    result = fetch("t", "--from", str(destination), "--to", str(tmp_path / "out"), trusted=keys["team"])
    assert result.returncode == 2
    assert result.stderr == (f"edgebuild: error: t {fingerprint[:12]} at {destination}/t/{fingerprint} is not taken: "
                             "it is unsigned (no model.sig); nothing fetched\n")
    assert not (tmp_path / "out").exists()
    missing = fetch("u", "--from", str(destination), "--to", str(tmp_path / "out"), trusted=keys["team"])
    assert missing.stderr == f"edgebuild: error: u: not published at {destination} (its index lists: t)\n"
    nowhere = fetch("t", "--from", str(tmp_path / "nowhere"), "--to", str(tmp_path / "out"), trusted=keys["team"])
    assert nowhere.stderr == (f"edgebuild: error: t: nothing is published at {tmp_path / 'nowhere'} (no index.json "
                              "there: is it where `doit publish --to` published?)\n")


@pytest.mark.parametrize("link", ["to a directory", "to nothing"])
def test_fetch_never_writes_through_a_link(tmp_path: Path, link: str) -> None:
    """A --to that is a symbolic link is refused before anything is read from the
    destination (here: one that does not exist), and nothing is written anywhere."""
    real = tmp_path / "real"
    if link == "to a directory":
        real.mkdir()
    (tmp_path / "models").symlink_to(real)
    result = fetch("t", "--from", str(tmp_path / "nowhere"), "--to", str(tmp_path / "models"), trusted=None)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"edgebuild: error: {tmp_path / 'models'}: a symbolic link to {real}; fetch creates the directory --to names "
        "and never writes through a link: give the directory itself, or a new name; nothing fetched\n"
    )
    expected = ["models", "real"] if link == "to a directory" else ["models"]
    assert sorted(path.name for path in tmp_path.iterdir()) == expected
    assert link == "to nothing" or list(real.iterdir()) == []
