"""SuperNode authentication for a federation on this machine: only the launcher's SuperNodes may join.

On loopback any local user could otherwise start a SuperNode against the SuperLink's Fleet port and
join the federation. So the launcher runs the SuperLink with `--enable-supernode-auth`, draws a fresh
key pair per site and per run (EC P-384, OpenSSH format, the private key owner-only in the site's
owner-only folder), registers each public key with `flwr supernode register` before any SuperNode
starts, and gives each SuperNode its private key (`--auth-supernode-private-key`): the SuperLink refuses
a node whose key it does not know. Flower allows SuperNode authentication over TLS only, so the launcher
also draws a certificate authority per run (`write_loopback_tls`): it signs the SuperLink's certificate
and is the only root the SuperNodes and `flwr` trust; its key is never written.

What this leaves open: the Control API (where keys are registered and runs submitted) has TLS but no
client authentication, so a local user who reaches it could still register a key (the ServerApp fails
a run that sees more SuperNodes than sites rather than train with a stranger) or submit a run (which
fails: only the launcher's app runs, in the launcher's run only, guard.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PRIVATE_KEY_FILE = "supernode_key"
PUBLIC_KEY_FILE = "supernode_key.pub"
REGISTER_TIMEOUT_S = 120.0
CERT_DAYS = 30


@dataclass(frozen=True)
class LoopbackTLS:
    ca: Path  # the run's root certificate: what the SuperNodes and `flwr` trust
    cert: Path  # the SuperLink's certificate (127.0.0.1 and localhost)
    key: Path  # its private key, owner-only


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def write_loopback_tls(folder: Path, host: str) -> LoopbackTLS:
    """A new CA and the SuperLink's certificate it signs (for 127.0.0.1, localhost and `host`), in `folder`
    (owner-only); the CA's key is not kept."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dpsynth federation CA (one run)")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA384())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(
            x509.SubjectAlternativeName(
                list(dict.fromkeys([_host_name("127.0.0.1"), x509.DNSName("localhost"), _host_name(host)]))
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA384())
    )
    tls = LoopbackTLS(folder / "ca.pem", folder / "superlink.pem", folder / "superlink.key")
    tls.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        tls.key,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    return tls


def write_site_keys(site_dir: Path) -> Path:
    """A new key pair in `site_dir` (the private key owner-only); the private key's path."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    path = site_dir / PRIVATE_KEY_FILE
    _write_private(path, private)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (site_dir / PUBLIC_KEY_FILE).write_bytes(public + b"\n")
    return path


def register_keys(site_dirs: list[Path], env: dict[str, str], cwd: Path) -> str | None:
    """Register every site's public key with the SuperLink named `local` in Flower's config (all at
    once); None when all succeeded, else what `flwr` said."""
    procs = [
        subprocess.Popen(
            ["flwr", "supernode", "register", str(d / PUBLIC_KEY_FILE), "local"],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for d in site_dirs
    ]
    failed = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=REGISTER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0:
            failed.append(out.strip())
    return "; ".join(failed) or None
