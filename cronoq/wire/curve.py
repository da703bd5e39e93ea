"""CurveZMQ encryption: key files, and how each side's socket is set up.

With `[broker] curve_secret_key_file` set, both broker sockets are CURVE
servers: everything on the wire — tokens, payloads, results — is encrypted,
and only peers that know the broker's public key can complete the
handshake. Clients and workers make a fresh key pair of their own per
connection; who they are is still said by their token.

Key files are ZeroMQ certificates as pyzmq writes and reads them
(`zmq.auth.create_certificates` / `load_certificate`): `NAME.key` holds the
public key and may be handed out; `NAME.key_secret` holds both and stays on
the broker's host, readable by its owner only.
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq
import zmq.auth

from cronoq.errors import FailedPrecondition, InvalidArgument

Z85_KEY_LENGTH = 40


def keygen(directory: str | os.PathLike[str], name: str = "broker", *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write a new key pair as NAME.key (public) and NAME.key_secret in `directory`; returns both paths.

    An existing pair is kept, and FailedPrecondition raised, unless `overwrite`: replacing it locks
    out every client and worker that holds the old public key.
    """
    folder = Path(directory)
    if not overwrite:
        for existing in (folder / f"{name}.key", folder / f"{name}.key_secret"):
            if existing.exists():
                raise FailedPrecondition(
                    f"{existing} already exists: a new pair would lock out every client and worker holding "
                    "the old public key; pass --force (overwrite=True) to replace it, or choose another --dir or --name"
                )
    folder.mkdir(parents=True, exist_ok=True)
    public_file, secret_file = (Path(p) for p in zmq.auth.create_certificates(str(folder), name))
    os.chmod(secret_file, 0o600)
    return public_file, secret_file


def load_secret_key(path: str | os.PathLike[str]) -> bytes:
    """The Z85 secret key from a NAME.key_secret file; raises InvalidArgument naming the file."""
    try:
        _, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"cannot read CURVE secret key file {path}: {exc}") from None
    if not secret:
        raise InvalidArgument(f"{path} holds no secret key: point curve_secret_key_file at the NAME.key_secret file")
    return secret


def public_key(value: str | bytes | os.PathLike[str]) -> bytes:
    """A broker public key given as its 40 Z85 characters, or as the path of a NAME.key file."""
    if isinstance(value, (str, bytes)) and len(value) == Z85_KEY_LENGTH and not os.path.exists(value):
        return value.encode() if isinstance(value, str) else value
    try:
        public, _ = zmq.auth.load_certificate(os.fsdecode(value))
    except (OSError, ValueError) as exc:
        raise InvalidArgument(
            f"the broker's public key must be 40 Z85 characters or a NAME.key file; {value!r}: {exc}"
        ) from None
    return public


def serve_encrypted(sock: zmq.Socket, secret_key: bytes) -> None:
    """Make a broker socket a CURVE server (call before bind)."""
    sock.curve_secretkey = secret_key
    sock.curve_publickey = zmq.curve_public(secret_key)
    sock.curve_server = True


def connect_encrypted(sock: zmq.Socket, server_public_key: bytes) -> None:
    """Make a client or worker socket a CURVE client of the broker with that public key (call before connect)."""
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey = server_public_key
    sock.curve_publickey = public
    sock.curve_secretkey = secret
