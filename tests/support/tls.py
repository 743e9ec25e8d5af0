"""Certificates for tests, made by the `openssl` command: a self-signed one for 127.0.0.1, and a
small CA with a server and a client certificate for mutual TLS."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SUBJECT_IP = "127.0.0.1"


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) of a self-signed certificate for 127.0.0.1 (subjectAltName IP:127.0.0.1)."""
    cert, key = folder / "server.pem", folder / "server.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", key, "-out", cert,
            "-subj", f"/CN={SUBJECT_IP}", "-addext", f"subjectAltName=IP:{SUBJECT_IP}")  # fmt: skip
    return cert, key


@dataclass(frozen=True)
class Authority:
    """A CA and two certificates it signed: the server's (for 127.0.0.1) and a client's."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def authority(folder: Path) -> Authority:
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", ca_key, "-out", ca,
            "-subj", "/CN=specdec test CA")  # fmt: skip
    paths = {}
    for role, usage in (("server", "serverAuth"), ("client", "clientAuth")):
        cert, key, request, ext = (folder / f"{role}{suffix}" for suffix in (".pem", ".key", ".csr", ".ext"))
        ext.write_text(f"subjectAltName=IP:{SUBJECT_IP}\nextendedKeyUsage={usage}\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", request, "-subj", f"/CN={role}")
        openssl("x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
                "-out", cert, "-extfile", ext)  # fmt: skip
        paths[role] = (cert, key)
    return Authority(ca, *paths["server"], *paths["client"])
