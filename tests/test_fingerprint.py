"""Byte-range digests: whatever the reading and hashing strategy, a span's digest is
plain single-threaded blake3 of exactly that span's bytes."""

from __future__ import annotations

import os
from pathlib import Path

import blake3
import pytest

from edgebuild.core import fingerprint
from edgebuild.core.fingerprint import _hash_ranges
from edgebuild.core.statcache import StatCache

from helpers import seeded_bytes

# The block the small file's spans are laid out around; reads use it and sizes either side.
SPAN_BLOCK = 64 * 1024


def reference_digest(data: bytes, span: tuple[int, int]) -> str:
    return blake3.blake3(data[span[0] : span[1]], max_threads=1).hexdigest()


def reference_digests(data: bytes, spans: list[tuple[int, int]]) -> list[tuple[tuple[int, int], str]]:
    """Each distinct span once, with its digest, in order."""
    return [(span, reference_digest(data, span)) for span in sorted(set(spans))]


def spans_around(block: int, size: int) -> list[tuple[int, int]]:
    """Spans that are empty, tiny, ending on a block boundary, exactly one block,
    straddling a boundary, multi-block with odd sizes, overlapping, apart from the
    others, and at the end of the file (the file starts on a block boundary)."""
    return [
        (0, 0),
        (0, 1),
        (1, block),
        (block, 2 * block),
        (2 * block, 2 * block),
        (2 * block, 3 * block - 1),
        (3 * block - 1, 3 * block + 1),
        (3 * block + 1, 5 * block + 12_345),
        (block // 2, 3 * block + 11),
        (5 * block + 20_000, 5 * block + 20_001),
        (6 * block + 3, size - 17),
        (size - 17, size),
        (size, size),
    ]


@pytest.fixture
def data_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = seeded_bytes(8 * SPAN_BLOCK + 4_321, 1)
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("read_block", [4096, SPAN_BLOCK, 1024 * 1024])
def test_range_digests_are_plain_blake3(
    monkeypatch: pytest.MonkeyPatch, data_file: tuple[Path, bytes], read_block: int
) -> None:
    """Spans many blocks long, exactly a block, and all in one block; small ones on blake3's threads too."""
    path, data = data_file
    monkeypatch.setattr(fingerprint, "READ_BLOCK", read_block)
    monkeypatch.setattr(fingerprint, "MULTITHREAD_SPAN", 16 * 1024)
    spans = spans_around(SPAN_BLOCK, len(data))
    assert sorted(_hash_ranges(path, spans, "shard")) == reference_digests(data, spans)


def test_range_digests_at_full_block_size(tmp_path: Path) -> None:
    """The real block size and read-ahead: spans of exactly one block and several."""
    block = fingerprint.READ_BLOCK
    data = seeded_bytes(3 * block + 999_999, 2)
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    spans = [(0, 7), (0, block), (7, 7 + block), (7 + block, 3 * block + 5), (3 * block + 5, len(data)), (0, len(data))]
    assert sorted(_hash_ranges(path, spans, "shard")) == reference_digests(data, spans)


def test_stat_cache_digests_match_reference(tmp_path: Path, data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    cache = StatCache(tmp_path / "statcache.sqlite")
    spans = spans_around(SPAN_BLOCK, len(data))
    assert cache.range_digests(path, spans) == {span: reference_digest(data, span) for span in spans}
    assert cache.file_digest(path) == reference_digest(data, (0, len(data)))


def test_span_past_the_end_of_the_file_is_an_error(data_file: tuple[Path, bytes]) -> None:
    path, data = data_file
    with pytest.raises(OSError, match="file ended"):
        dict(_hash_ranges(path, [(0, 10), (len(data) - 5, len(data) + 5)], "shard"))


def test_tool_versions_are_read_once_a_process_and_afresh_after_a_fork() -> None:
    """A worker forked from a long-lived (shared) fork server reads the versions itself:
    the server may have outlived a ``pip install``."""
    versions = fingerprint.tool_versions()
    assert () in fingerprint._VERSIONS_CACHE
    versions["torch"] = "edited by a caller"
    assert fingerprint.tool_versions()["torch"] != "edited by a caller"
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write_end, b"empty" if not fingerprint._VERSIONS_CACHE else b"inherited")
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(child, 0)
    assert status == 0
    assert os.read(read_end, 16) == b"empty"
    os.close(read_end)


@pytest.mark.parametrize("record", [
    # A record's shape: the checkpoint's part shared, the rest not.
    {"format": 1, "kind": "k", "params": {"b": [1, 2], "a": {"x": None}}, "code": {"z.py": "d1", "a.py": "d2"},
     "inputs": {"checkpoint": "SHARED", "files:calibration": ["d3"], "source": {"outputs": {"m.onnx": "d4"}}},
     "versions": {"torch": "2.13"}},
    # Shared at the top, keys needing escapes, non-ASCII text.
    {"é": "ü", "tensors": "SHARED", "a\"b": {"\n": 1.5e-7}},
    # Nothing shared, keys that are not strings.
    {"params": {1: "one", 2: "two"}, "inputs": {}},
])
def test_a_shared_part_encoded_once_digests_as_the_whole(record: dict) -> None:
    """The fingerprint of a record that holds a checkpoint's part encoded once is the
    fingerprint json would give the whole: no artifact's fingerprint moves."""
    from edgebuild.core.hashing import EncodedOnce, digest_json, digest_json_sharing

    shared = EncodedOnce({"config": "c", "tensors": {"w": {"dtype": "F32", "shape": [2, 3], "digest": "d5"}}, "files": {}})

    def with_shared(value):
        if value == "SHARED":
            return shared
        return {key: with_shared(item) for key, item in value.items()} if isinstance(value, dict) else value

    plain = {key: (dict(shared) if value == "SHARED" else value) for key, value in record.items()}
    plain = {key: ({k: (dict(shared) if v == "SHARED" else v) for k, v in value.items()} if isinstance(value, dict) else value)
             for key, value in plain.items()}
    assert digest_json_sharing(with_shared(record)) == digest_json(plain)


CANONICAL_CASES = [
    {"b": [1, 2.5, -0.0, 1e-7, 1e300, 12345678901234567890], "a": {"x": None, "y": True, "z": False}},
    {"é": "ü\u2028\n\"\\", "": [], "nested": [{"k": "v"}, [[]]]},
    [float("nan"), float("inf"), float("-inf")],
    "text", 7, 0.1, None,
]


@pytest.mark.parametrize("value", CANONICAL_CASES)
def test_canonical_json_is_the_text_json_dumps_writes(value, monkeypatch) -> None:
    """Fingerprints, store entries and signatures hash this text: json's C encoder made once
    writes what json.dumps(sort_keys=True, compact, ASCII) writes, and so does the encoder
    a Python without it uses."""
    import json

    from edgebuild.core import hashing
    from edgebuild.core.hashing import EncodedOnce, canonical_json

    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert canonical_json(value) == expected
    if isinstance(value, dict):
        assert EncodedOnce(value).text == expected
    monkeypatch.setattr(hashing, "_CANONICAL", None)
    assert canonical_json(value) == expected
