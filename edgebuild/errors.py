"""One exception class per kind of failure.

The CLI prints these without a traceback: their message is the whole story
(file, key, what was expected, what was found).
"""

from __future__ import annotations


class EdgebuildError(Exception):
    """Base of every error edgebuild reports to a user."""


class ManifestError(EdgebuildError):
    """The manifest is malformed: YAML, schema, references or matrix."""


class CheckpointError(EdgebuildError):
    """A checkpoint is missing, incomplete, or not of the expected architecture."""


class ParameterError(EdgebuildError):
    """Parameters are well-typed but impossible for this checkpoint (an image size that
    does not divide into patches, a layer count outside the model). ``key`` names the
    manifest key at fault, so the message can point at its line."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ExportError(EdgebuildError):
    """The exporter failed, or the module to export does not match the model."""


class BuildRejected(ExportError):
    """The target's tool refused this input and would again: the same fingerprint fails
    the same way (a QNN compile of a graph with a node the backend has no kernel for).
    The store remembers it, and the build is not tried again until something in its
    fingerprint changes."""


class VerificationFailed(EdgebuildError):
    """At least one verification check failed; the message lists every failed check."""


class StoreError(EdgebuildError):
    """The content-addressed store or a remote holds something it must not serve."""


class FilesystemError(EdgebuildError):
    """A file could not be read or written: a full disk, a read-only or missing
    directory, no permission. Raised from an ``OSError`` with the path named."""

    @classmethod
    def of(cls, error: OSError, path: object, doing: str) -> "FilesystemError":
        where = error.filename if error.filename is not None else path
        return cls(f"{where}: {doing}: {error.strerror or error}")


class InitError(EdgebuildError):
    """``python -m edgebuild init`` cannot lay out the project where it was asked to;
    raised before anything is written."""


class RecordError(StoreError):
    """A build record (beside a build, in the store or from a remote) is not one this
    version can read."""


class RemoteError(EdgebuildError):
    """A remote location (a directory or an fsspec URL) could not be read or written."""


class UnvouchedEntry(RemoteError):
    """A pull that takes only builds signed by a trusted key (``--pull-only`` with trusted
    keys) found one that no trusted key signed."""


class PublishError(EdgebuildError):
    """Publishing was refused: an artifact is not verified, or the destination already
    holds different content under the same key."""


class FetchError(EdgebuildError):
    """A published artifact could not be fetched: not published, or not what its
    checksums and signature say. Nothing was written."""


class LockfileError(EdgebuildError):
    """The lock file (``<manifest stem>.lock``) exists but is not one this version can read."""


class DiffError(EdgebuildError):
    """`doit diff --against REF` cannot read REF: not a commit, outside git, a lock file
    at REF that is not one, or a destination that cannot be read."""


class WorkerError(EdgebuildError):
    """A worker process building or verifying one artifact crashed (a signal, the
    kernel's OOM killer) or was interrupted; the message names the artifact."""


class WorkerKilled(WorkerError):
    """A worker process ended by a signal (the OOM killer, a kill) or with the fork
    server it came from, before handing back its result: what it had written stands,
    and nothing of it raised."""


class ClusterError(EdgebuildError):
    """A cluster cannot run what was asked: its scheduler is unreachable, no worker
    offers the resources an artifact needs, a worker was lost, or the workers have no
    remote cache to hand builds back through."""


class ConfigError(EdgebuildError):
    """An ``EDGEBUILD_*`` environment variable, or an option that sets one, holds a value
    of the wrong shape; the message names the variable and what was expected."""


class PluginError(EdgebuildError):
    """An artifact kind could not be loaded: its entry point's module does not import, or
    the class does not declare what every kind must. The message names the entry point."""


class PlanChanged(WorkerError):
    """A worker process computed another fingerprint than the run planned with: the
    manifest, an input or the code changed meanwhile, or (on a cluster) the worker sees
    another checkout or environment. Nothing was built."""


class NotRunnable(EdgebuildError):
    """An artifact cannot be run on this machine (no runtime for it here, or a simulator
    too slow for its size): its kind's ``runner`` says why. What needs running it is
    then not measured, and the report says so."""


class SourceNotVerified(EdgebuildError):
    """An artifact's verification does not count while an artifact it is made from (a
    source, or a source's source) is not verified: it is not judged, kept or pushed.
    ``source`` names the nearest such ancestor."""

    def __init__(self, message: str, source: str) -> None:
        super().__init__(message)
        self.source = source
