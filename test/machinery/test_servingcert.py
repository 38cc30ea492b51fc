"""The metrics server's self-signed certificate (pko.machinery.servingcert): made in a child process,
so the serving process never loads ``cryptography`` (issue 44), with the properties it always had.

Certificates are read back with ``cryptography`` here, in the test process; what the serving process
imports is checked in fresh interpreters.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pko.machinery.servingcert import SELF_SIGNED_VALIDITY, self_signed, self_signed_apart, start_self_signed

REPO = Path(__file__).resolve().parents[2]
HOSTS = ["metrics.example", "127.0.0.1", "::1", "metrics.example"]


def properties(cert_pem: bytes, key_pem: bytes) -> dict[str, object]:
    """What a scraper sees of a pair, and that the key is the certificate's."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.public_key() == cert.public_key()
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, unencrypted
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    now = datetime.datetime.now(datetime.UTC)
    return {
        "curve": key.curve.name,
        "signature": cert.signature_hash_algorithm.name if cert.signature_hash_algorithm else None,
        "subject": cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value,
        "self-issued": cert.issuer == cert.subject,
        "dns": san.value.get_values_for_type(x509.DNSName),
        "ips": san.value.get_values_for_type(x509.IPAddress),
        "san critical": san.critical,
        "ca": (constraints.value.ca, constraints.critical),
        "usage": (list(usage.value), usage.critical),
        "validity": cert.not_valid_after_utc - cert.not_valid_before_utc,
        "valid now": cert.not_valid_before_utc < now < cert.not_valid_after_utc,
    }


def test_the_pair_made_in_a_child_is_the_one_made_in_process() -> None:
    apart, here = properties(*self_signed_apart(HOSTS)), properties(*self_signed(HOSTS))
    assert apart == here
    assert apart == {
        "curve": ec.SECP256R1().name,
        "signature": hashes.SHA256().name,
        "subject": "metrics.example@pko-metrics",
        "self-issued": True,
        "dns": ["metrics.example"],
        "ips": [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")],
        "san critical": False,
        "ca": (False, True),
        "usage": ([ExtendedKeyUsageOID.SERVER_AUTH], False),
        "validity": SELF_SIGNED_VALIDITY + datetime.timedelta(minutes=5),
        "valid now": True,
    }


def test_each_pair_is_new() -> None:
    first, second = self_signed_apart(["a.example"]), self_signed_apart(["a.example"])
    assert first[1] != second[1]
    assert x509.load_pem_x509_certificate(first[0]).serial_number != (
        x509.load_pem_x509_certificate(second[0]).serial_number
    )


def fresh(script: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_serving_process_never_loads_cryptography() -> None:
    script = (
        "import sys, ssl\n"
        "from pko.machinery.servingcert import CertSource\n"
        "context = CertSource(hosts=['localhost', '127.0.0.1']).context()\n"
        "assert context.minimum_version == ssl.TLSVersion.TLSv1_2\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(loaded & {'cryptography', 'bcrypt', '_cffi_backend'}))\n"
    )
    assert fresh(script) == "[]"


def test_a_frozen_executable_makes_the_pair_in_process() -> None:
    # PyInstaller sets sys.frozen; its sys.executable is the bundle, which runs no ``-m``.
    script = (
        "import sys\n"
        "sys.frozen = True\n"
        "from pko.machinery.servingcert import self_signed_apart\n"
        "cert, key = self_signed_apart(['localhost'])\n"
        "print(cert.startswith(b'-----BEGIN CERTIFICATE-----'), 'cryptography' in sys.modules)\n"
    )
    assert fresh(script) == "True True"


def test_a_child_that_fails_says_why() -> None:
    with pytest.raises(RuntimeError, match=r"-m pko.machinery.servingcert exited 2: usage: "):
        self_signed_apart([])


def test_a_pair_started_ahead_is_taken_once() -> None:
    start_self_signed(HOSTS)
    start_self_signed(HOSTS)  # one child per hosts
    ahead = self_signed_apart(HOSTS)
    assert properties(*ahead) == properties(*self_signed(HOSTS))
    assert self_signed_apart(HOSTS)[1] != ahead[1]  # the next is made anew


def test_a_certificate_source_takes_the_pair_started_for_the_default_hosts() -> None:
    script = (
        "import sys\n"
        "from pko.machinery import servingcert\n"
        "servingcert.start_self_signed()\n"
        "child = next(iter(servingcert._started.values()))\n"
        "servingcert.CertSource().context()\n"
        "print(child.returncode, len(servingcert._started), 'cryptography' in sys.modules)\n"
    )
    assert fresh(script) == "0 0 False"


def test_a_pair_started_ahead_and_never_taken_is_stopped_at_exit() -> None:
    script = (
        "from pko.machinery import servingcert\n"
        "servingcert.start_self_signed(['localhost'])\n"
        "print(next(iter(servingcert._started.values())).pid)\n"
    )
    pid = int(fresh(script))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
