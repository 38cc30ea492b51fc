"""Passphrase secrets: the real CLI's formats, with a stdlib cipher instead of AES-GCM.

The real ``passphrase`` provider stores ``encryptionsalt: v1:<salt>:v1:<nonce>:<ciphertext of "pulumi">``
in ``Pulumi.<stack>.yaml`` and writes each secret as ``v1:<nonce>:<ciphertext>``. We keep those shapes
but encrypt with an HMAC-SHA256 keystream plus an HMAC tag (encrypt-then-MAC), because the standard
library has no AES. Values are therefore NOT readable by the real CLI, and vice versa. A wrong
passphrase fails the tag check, which is how the wrong-passphrase error is detected, as in the real
CLI (it decrypts the ``"pulumi"`` check value).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

from .errors import CliError

# Far fewer PBKDF2 rounds than the real CLI's 1,000,000: every CLI call derives the key once.
_ROUNDS = 20_000
_CHECK = "pulumi"

MISSING_PASSPHRASE = (
    "passphrase must be set with PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE "
    "environment variables"
)
WRONG_PASSPHRASE = (
    "incorrect passphrase, please set PULUMI_CONFIG_PASSPHRASE to the correct passphrase or set "
    "PULUMI_CONFIG_PASSPHRASE_FILE to a file containing the passphrase"
)


def read_passphrase() -> str:
    """The passphrase from the environment; non-interactive, so never prompts."""
    phrase = os.environ.get("PULUMI_CONFIG_PASSPHRASE")
    if phrase is not None:
        return phrase
    phrase_file = os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE")
    if phrase_file:
        try:
            return Path(phrase_file).resolve().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"unable to read PULUMI_CONFIG_PASSPHRASE_FILE: {exc}") from exc
    raise CliError(MISSING_PASSPHRASE)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


class Crypter:
    """Encrypts and decrypts secret values with a key derived from a passphrase and salt."""

    def __init__(self, passphrase: str, salt: bytes) -> None:
        key = hashlib.pbkdf2_hmac("sha256", passphrase.encode("utf-8"), salt, _ROUNDS, dklen=64)
        self._enc_key = key[:32]
        self._mac_key = key[32:]

    def _keystream(self, nonce: bytes, length: int) -> bytes:
        blocks = []
        for counter in range((length + 31) // 32):
            blocks.append(hmac.digest(self._enc_key, nonce + counter.to_bytes(8, "big"), "sha256"))
        return b"".join(blocks)[:length]

    def encrypt(self, plaintext: str) -> str:
        data = plaintext.encode("utf-8")
        nonce = os.urandom(12)
        body = bytes(a ^ b for a, b in zip(data, self._keystream(nonce, len(data)), strict=True))
        tag = hmac.digest(self._mac_key, nonce + body, "sha256")[:16]
        return f"v1:{_b64(nonce)}:{_b64(body + tag)}"

    def decrypt(self, ciphertext: str) -> str:
        """Decrypt ``v1:<nonce>:<body+tag>``; raises CliError on a wrong key or a malformed value."""
        parts = ciphertext.split(":")
        if len(parts) != 3 or parts[0] != "v1":
            raise CliError("failed to decrypt: malformed ciphertext")
        try:
            nonce, blob = _unb64(parts[1]), _unb64(parts[2])
        except ValueError as exc:
            raise CliError("failed to decrypt: malformed ciphertext") from exc
        body, tag = blob[:-16], blob[-16:]
        if not hmac.compare_digest(tag, hmac.digest(self._mac_key, nonce + body, "sha256")[:16]):
            raise CliError("failed to decrypt: " + WRONG_PASSPHRASE)
        return bytes(a ^ b for a, b in zip(body, self._keystream(nonce, len(body)), strict=True)).decode(
            "utf-8"
        )


def new_salt_state(passphrase: str) -> tuple[str, Crypter]:
    """A fresh ``encryptionsalt`` value and the crypter it describes."""
    salt = os.urandom(8)
    crypter = Crypter(passphrase, salt)
    return f"v1:{_b64(salt)}:{crypter.encrypt(_CHECK)}", crypter


def crypter_from_state(passphrase: str, state: str) -> Crypter:
    """The crypter for an existing ``encryptionsalt``; a wrong passphrase is an error, as in the real CLI."""
    parts = state.split(":", 2)
    if len(parts) != 3 or parts[0] != "v1":
        raise CliError("malformed state value")
    try:
        salt = _unb64(parts[1])
    except ValueError as exc:
        raise CliError("malformed state value") from exc
    crypter = Crypter(passphrase, salt)
    try:
        ok = crypter.decrypt(parts[2]) == _CHECK
    except CliError:
        ok = False
    if not ok:
        raise CliError(WRONG_PASSPHRASE)
    return crypter
