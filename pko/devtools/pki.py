"""The PKI of the test control plane (hack/localcluster.py) and of the local node (hack/localnode.py):
a CA, the certificates it signs and the service-account key pair, made with the openssl CLI.

Standard library only (it runs before the project's virtualenv exists).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DAYS = "3650"  # the CA and every certificate
KEY = "rsa:2048"
# The names in-cluster clients use for the apiserver (the `kubernetes` Service), as kubeadm's cert has.
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Cert:
    """A certificate the CA signs: ``<name>.crt`` and its key ``<name>.key``."""

    name: str
    subject: str  # openssl's -subj, e.g. "/O=system:masters/CN=kube-apiserver-kubelet-client"
    usage: str  # extendedKeyUsage: "serverAuth", "clientAuth" or "serverAuth,clientAuth"
    sans: tuple[str, ...] = ()  # subjectAltName entries ("IP:10.0.0.1", "DNS:localhost")


def apiserver_sans(*ips: str) -> tuple[str, ...]:
    """An apiserver serving cert's SANs: these addresses (in this order), then :data:`APISERVER_DNS`."""
    return (*(f"IP:{ip}" for ip in ips), *(f"DNS:{name}" for name in APISERVER_DNS))


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")


def ensure_pki(d: Path, ca_cn: str, certs: Sequence[Cert]) -> None:
    """In ``d``: the CA (``ca.crt``/``ca.key``, CN ``ca_cn``), ``certs`` signed by it (key usage
    digitalSignature,keyEncipherment; 10 years) and the service-account key pair ``sa.key``/``sa.pub``.
    Kept as they are when every file is there (a restart over the same directory keeps its CA);
    otherwise all made anew."""
    outputs = ["ca.crt", "ca.key", "sa.key", "sa.pub"]
    outputs += [f"{c.name}.{ext}" for c in certs for ext in ("crt", "key")]
    if all((d / f).exists() for f in outputs):
        return
    d.mkdir(parents=True, exist_ok=True)
    ca_crt, ca_key = str(d / "ca.crt"), str(d / "ca.key")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        KEY,
        "-nodes",
        "-days",
        DAYS,
        "-keyout",
        ca_key,
        "-out",
        ca_crt,
        "-subj",
        f"/CN={ca_cn}",
    )
    for c in certs:
        sign(d, c)
    _openssl("genrsa", "-out", str(d / "sa.key"), "2048")
    _openssl("rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))


def sign(ca_dir: Path, cert: Cert, out: Path | None = None) -> None:
    """``cert`` signed by the CA in ``ca_dir`` (``ca.crt``/``ca.key``, which it leaves untouched):
    ``<name>.crt``/``<name>.key`` in ``out`` (default ``ca_dir``), with the serial file there too, so a
    certificate for another directory (the local node's second kubelet) writes nothing in ``ca_dir``."""
    out = out or ca_dir
    out.mkdir(parents=True, exist_ok=True)
    ext = out / f"{cert.name}.cnf"
    ext.write_text(
        "[ext]\nkeyUsage=digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage={cert.usage}\n" + (f"subjectAltName={','.join(cert.sans)}\n" if cert.sans else "")
    )
    key, csr, crt = (str(out / f"{cert.name}.{x}") for x in ("key", "csr", "crt"))
    _openssl("req", "-newkey", KEY, "-nodes", "-keyout", key, "-out", csr, "-subj", cert.subject)
    _openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        str(ca_dir / "ca.crt"),
        "-CAkey",
        str(ca_dir / "ca.key"),
        "-CAserial",
        str(out / "ca.srl"),
        "-CAcreateserial",
        "-days",
        DAYS,
        "-out",
        crt,
        "-extfile",
        str(ext),
        "-extensions",
        "ext",
    )
