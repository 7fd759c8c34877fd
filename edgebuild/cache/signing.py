"""Who may make a runner believe a build is verified: signed remote-cache entries.

Anyone who can write the remote cache's bucket can write an entry whose outputs,
digests and build record agree with each other and with its fingerprint (the
fingerprint covers a build's inputs, not its outputs), and keep a passing report
beside it. The checks in ``remote.py`` catch damage, not such an entry. So a pulled
report counts as a verdict only when the entry is signed by a key the runner trusts
(as Nix takes a substituter's path only when signed by a key in
``trusted-public-keys``); any other pulled build is a build like one exported here,
and is judged here before anything calls it verified.

Keys are ECDSA P-256 pairs in PEM (PKCS#8 private key, SubjectPublicKeyInfo public
key), the kind OpenSSF ``model-signing``'s key signer takes, so one pair can sign
cache entries and releases. ``python -m edgebuild keygen PREFIX`` writes one. A key
file holds one key (several PEM blocks are refused: list one file per key); a private
key readable by anyone but its owner, or a trusted key that anyone may rewrite (the
file, or its directory unless sticky), is refused, as ssh refuses them.

An entry's signature covers the canonical JSON of the entry (format, fingerprint and
every file's size and blake3 digest: the outputs, the build record and the reports),
so through the digests it covers every byte a pull writes.

The settings: ``EDGEBUILD_SIGNING_KEY`` (the private key a runner signs its pushes
with; its own public key is trusted too) and ``EDGEBUILD_TRUSTED_KEYS`` (public keys,
comma-separated, whose entries a pull takes as verified).
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.core.files import UnreadableFile, read_bytes
from edgebuild.core.hashing import canonical_json
from edgebuild.errors import ConfigError

if TYPE_CHECKING:
    from edgebuild.core.config import Settings

ALGORITHM = "ecdsa-p256-sha256"
# Signed bytes start with what they are, so a signature over an entry is never
# mistaken for one over anything else the same key signs (a release, say).
ENTRY_DOMAIN = b"edgebuild remote-cache entry v1\n"
# A PEM key is a few hundred bytes; read no more than this from a key file.
KEY_FILE_BYTES = 64 << 10
KEY_ID_SHOWN = 16


def key_id(public_key: Any) -> str:
    """The sha256 of the key's DER SubjectPublicKeyInfo, in hex: what an entry names."""
    from cryptography.hazmat.primitives import serialization

    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def generate(prefix: Path) -> tuple[Path, Path]:
    """Write a new pair: ``PREFIX.key`` (private, mode 0600) and ``PREFIX.pub``. Never
    overwrites: an existing file of either name is an error, and nothing is written."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private_path, public_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise ConfigError(f"{path}: exists already; keygen never overwrites a key (choose another PREFIX)")
        if not path.parent.is_dir():
            raise ConfigError(f"{path.parent}: no such directory for the key pair")
    private_key = ec.generate_private_key(ec.SECP256R1())
    private_pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        # Created with 0600 from the start: the private key is never readable by others.
        descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as writer:
            writer.write(private_pem)
        descriptor = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(descriptor, "wb") as writer:
            writer.write(public_pem)
    except OSError as error:
        for path in (private_path, public_path):
            path.unlink(missing_ok=True)
        raise ConfigError(f"{error.filename or prefix}: cannot write the key pair ({error.strerror})") from None
    return private_path, public_path


def _read_key_file(path: Path, variable: str, private: bool) -> bytes:
    """The bytes of one PEM key, through the bounded reader (a FIFO is refused, never
    waited on), from a file whose permissions keep it what it is: a private key readable
    by its owner only, a trusted public key (and its directory) writable by no one else.
    ssh and gpg refuse the same; a key anyone may rewrite decides nothing."""
    try:
        data = read_bytes(path, KEY_FILE_BYTES)
    except UnreadableFile as error:
        raise ConfigError(f"{variable}: {path}: {error}; expected a PEM key file") from None
    except OSError as error:
        raise ConfigError(f"{variable}: {path}: cannot read the key ({error.strerror or error})") from None
    _check_permissions(path, variable, private)
    blocks = data.count(b"-----BEGIN ")
    if blocks > 1:
        # Trusting the first silently was the bug; trusting all would let cache entries
        # and releases (model-signing takes one key per file) disagree on who is trusted.
        raise ConfigError(f"{variable}: {path}: holds {blocks} PEM blocks; expected one key per file (put each key in a "
                          "file of its own and list every file, comma-separated)")
    return data


def _check_permissions(path: Path, variable: str, private: bool) -> None:
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if private and mode & 0o077:
        raise ConfigError(f"{variable}: {path}: mode {mode:04o} lets others than its owner read or write the private "
                          f"key; refused, as ssh refuses such a key (chmod 600 {path})")
    if private:
        return
    if mode & 0o022:
        # Group-writable too: ssh refuses an authorized_keys its group may rewrite.
        raise ConfigError(f"{variable}: {path}: mode {mode:04o} lets others than its owner rewrite a trusted key, and "
                          f"with it what counts as verified here; refused, as ssh refuses such a key (chmod go-w {path})")
    for folder in dict.fromkeys((path.absolute().parent, Path(os.path.realpath(path)).parent)):
        info = os.stat(folder)
        # A sticky directory (/tmp) lets no one else replace a file they do not own.
        if info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX:
            raise ConfigError(f"{variable}: {path}: its directory {folder} (mode {stat.S_IMODE(info.st_mode):04o}) lets "
                              f"anyone replace the trusted key; refused (chmod o-w {folder})")


def load_private_key(path: Path, variable: str = "EDGEBUILD_SIGNING_KEY") -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = _read_key_file(path, variable, private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise ConfigError(
            f"{variable}: {path}: expected an unencrypted PEM private key of ECDSA P-256 "
            "(python -m edgebuild keygen PREFIX writes one)"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ConfigError(f"{variable}: {path}: expected an ECDSA P-256 private key, found another kind of key")
    return key


def load_public_key(path: Path, variable: str = "EDGEBUILD_TRUSTED_KEYS") -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = _read_key_file(path, variable, private=False)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        hint = " (that is the private key: name PREFIX.pub)" if b"PRIVATE KEY" in data else ""
        raise ConfigError(f"{variable}: {path}: expected a PEM public key of ECDSA P-256{hint}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ConfigError(f"{variable}: {path}: expected an ECDSA P-256 public key, found another kind of key")
    return key


def entry_message(entry: dict[str, Any]) -> bytes:
    """The bytes an entry's signature covers: everything in it but the signature."""
    return ENTRY_DOMAIN + canonical_json({key: value for key, value in entry.items() if key != "signature"}).encode()


@dataclass(frozen=True)
class Trust:
    """The keys of one runner: the one it signs its pushes with (if any) and those whose
    signatures it takes as verification (its own among them)."""

    signing_key: Any = None
    trusted: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: "Settings") -> "Trust":
        """The keys the ``signing_key`` and ``trusted_keys`` settings name; a key that cannot
        be read or is not ECDSA P-256 is a :class:`ConfigError` naming the variable and file."""
        trusted = {}
        for path in settings.trusted_key_paths:
            public_key = load_public_key(Path(path))
            trusted[key_id(public_key)] = public_key
        signing_key = None
        if settings.signing_key:
            signing_key = load_private_key(Path(settings.signing_key))
            trusted[key_id(signing_key.public_key())] = signing_key.public_key()
        return cls(signing_key, trusted)

    @property
    def configured(self) -> bool:
        """Whether any key is trusted: with none, every pulled build is judged here."""
        return bool(self.trusted)

    def sign(self, entry: dict[str, Any]) -> dict[str, Any]:
        """``entry`` with a ``signature`` by the signing key (unchanged without one)."""
        if self.signing_key is None:
            return entry
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        value = self.signing_key.sign(entry_message(entry), ec.ECDSA(hashes.SHA256()))
        signature = {
            "algorithm": ALGORITHM,
            "key": key_id(self.signing_key.public_key()),
            "value": base64.b64encode(value).decode("ascii"),
        }
        return {**{key: item for key, item in entry.items() if key != "signature"}, "signature": signature}

    def distrust(self, entry: dict[str, Any]) -> str | None:
        """Why ``entry``'s report may not be taken as verification here (``None``: it may,
        signed by a trusted key, and the signature matches)."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        signature = entry.get("signature")
        if signature is None:
            return "it is unsigned"
        if (
            not isinstance(signature, dict)
            or signature.get("algorithm") != ALGORITHM
            or not isinstance(signature.get("key"), str)
            or not isinstance(signature.get("value"), str)
        ):
            return f"its signature is not an {ALGORITHM} signature with a key id"
        named = signature["key"]
        shown = named[:KEY_ID_SHOWN] if named.isascii() and named.isalnum() else "(unreadable)"
        public_key = self.trusted.get(named)
        if public_key is None:
            if not self.trusted:
                return f"it is signed by key {shown}, and no key is trusted here (EDGEBUILD_TRUSTED_KEYS)"
            return f"it is signed by key {shown}, which is not a trusted key (EDGEBUILD_TRUSTED_KEYS)"
        try:
            value = base64.b64decode(signature["value"], validate=True)
            public_key.verify(value, entry_message(entry), ec.ECDSA(hashes.SHA256()))
        except (ValueError, InvalidSignature):
            return f"its signature by key {shown} does not match the entry"
        return None
