"""The build record: created with its fingerprint, validated on read, completed by a build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild.errors import RecordError
from edgebuild.core.record import RECORD_FILE, RECORD_FORMAT, BuildRecord, output_manifest, read_record

from helpers import seeded_bytes


def _record() -> BuildRecord:
    return BuildRecord.create(kind="k", params={"size": 64}, inputs={"file:a": "0" * 64}, code={}, versions={"torch": "2"})


def test_fingerprint_is_the_digest_of_the_fingerprinted_keys() -> None:
    record = _record()
    assert record.hashes_to() == record.fingerprint
    assert BuildRecord.create(kind="k", params={"size": 65}, inputs={"file:a": "0" * 64}, code={},
                              versions={"torch": "2"}).fingerprint != record.fingerprint


def test_completing_keeps_the_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"x" * 10)
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / ".hidden").write_text("")
    complete = _record().completed("a", {"timings": {"load_s": 1.0}}, 1.5, output_manifest(tmp_path))
    assert complete.hashes_to() == complete.fingerprint == _record().fingerprint
    assert list(complete.outputs) == ["model.bin"]
    complete.write(tmp_path)
    assert read_record(tmp_path) == complete
    assert complete.changed_outputs(tmp_path) == []
    (tmp_path / "model.bin").write_bytes(b"y" * 10)
    assert complete.changed_outputs(tmp_path, digest=None) == []
    assert complete.changed_outputs(tmp_path) == ["model.bin"]
    (tmp_path / "model.bin").unlink()
    assert complete.changed_outputs(tmp_path, digest=None) == ["model.bin"]


def test_missing_record_is_none(tmp_path: Path) -> None:
    assert read_record(tmp_path) is None
    assert read_record(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("[1, 2]", "not a build record (expected a JSON object, found list)"),
        ("{", "not a build record (not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
        ('{"format": 1}', "a build record of format 1; this edgebuild reads format 3"),
        (json.dumps({"format": RECORD_FORMAT, "kind": "k"}), "not a build record (params: Field required)"),
    ],
)
def test_record_of_the_wrong_shape_is_a_clear_error(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / RECORD_FILE).write_text(content)
    with pytest.raises(RecordError) as caught:
        read_record(tmp_path)
    assert str(caught.value) == f"{tmp_path / RECORD_FILE}: {expected}"


def test_output_digest_must_be_a_digest(tmp_path: Path) -> None:
    data = _record().to_json() | {"outputs": {"model.bin": {"size": 1, "digest": "../../etc/passwd"}}}
    (tmp_path / RECORD_FILE).write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"outputs -> model.bin -> digest: Value error, expected a blake3 digest"):
        read_record(tmp_path)



@pytest.mark.parametrize("size", [0, 1, 1024 * 1024 + 7, 40 * 1024 * 1024 + 3])
def test_output_digests_through_a_mapping_are_the_file_digests(tmp_path: Path, size: int) -> None:
    """Outputs are hashed through a file mapping on every core; the digest is the one
    ``file_digest`` (reading) gives, whatever the size."""
    from edgebuild.core.hashing import file_digest, written_file_digest

    path = tmp_path / "out.bin"
    path.write_bytes(seeded_bytes(size, size))
    assert written_file_digest(path) == file_digest(path)
    assert output_manifest(tmp_path)["out.bin"].digest == file_digest(path)
