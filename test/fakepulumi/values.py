"""Property values as the engine carries them: plain JSON-like data plus secret and unknown markers.

A value is None, bool, int, float, str, list or dict, or a :class:`Secret` wrapping one, or
:data:`UNKNOWN` (an output not known during preview). Secrets travel as wrappers so that state,
events and outputs can each render them the way the real engine does (see SerializePropertyValue in
pkg/resource/stack/deployment.go and filterPropertyValue in pkg/engine/events.go).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
UNKNOWN_STRING = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


class _Unknown:
    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Secret:
    value: Any


def is_secret_value(value: Any) -> bool:
    if isinstance(value, Secret):
        return True
    if isinstance(value, dict):
        return any(is_secret_value(v) for v in value.values())
    if isinstance(value, list):
        return any(is_secret_value(v) for v in value)
    return False


def has_unknown(value: Any) -> bool:
    if value is UNKNOWN:
        return True
    if isinstance(value, Secret):
        return has_unknown(value.value)
    if isinstance(value, dict):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(has_unknown(v) for v in value)
    return False


def plain(value: Any) -> Any:
    """Strip secret markers (unknowns stay)."""
    if isinstance(value, Secret):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def reveal(value: Any) -> tuple[Any, bool]:
    """(plain value, whether any part was secret)."""
    return plain(value), is_secret_value(value)


def to_state(value: Any, encrypt: Callable[[str], str]) -> Any:
    """Checkpoint form: secrets become signature objects carrying ciphertext of their JSON."""
    if isinstance(value, Secret):
        return {
            SIG_KEY: SECRET_SIG,
            "ciphertext": encrypt(json.dumps(plain(value.value), separators=(",", ":"))),
        }
    if isinstance(value, dict):
        return {k: to_state(v, encrypt) for k, v in value.items()}
    if isinstance(value, list):
        return [to_state(v, encrypt) for v in value]
    if value is UNKNOWN:
        return UNKNOWN_STRING
    return value


def _is_secret_sig(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


def from_state(value: Any, decrypt: Callable[[str], str]) -> Any:
    if _is_secret_sig(value):
        if "plaintext" in value:
            return Secret(json.loads(value["plaintext"]))
        return Secret(json.loads(decrypt(value["ciphertext"])))
    if isinstance(value, dict):
        return {k: from_state(v, decrypt) for k, v in value.items()}
    if isinstance(value, list):
        return [from_state(v, decrypt) for v in value]
    return value


def state_has_secrets(value: Any) -> bool:
    if _is_secret_sig(value):
        return True
    if isinstance(value, dict):
        return any(state_has_secrets(v) for v in value.values())
    if isinstance(value, list):
        return any(state_has_secrets(v) for v in value)
    return False


def mask_state(value: Any) -> Any:
    """State values with secrets replaced by ``"[secret]"`` without decrypting (``stack output``)."""
    if _is_secret_sig(value):
        return "[secret]"
    if isinstance(value, dict):
        return {k: mask_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_state(v) for v in value]
    return value


def to_event(value: Any) -> Any:
    """Engine-event form: secrets blinded (ciphertext ``[secret]``), unknowns as the unknown sentinel."""
    if isinstance(value, Secret):
        return {SIG_KEY: SECRET_SIG, "ciphertext": "[secret]"}
    if isinstance(value, dict):
        return {k: to_event(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_event(v) for v in value]
    if value is UNKNOWN:
        return UNKNOWN_STRING
    return value


def to_plaintext_state(value: Any) -> Any:
    """``stack export --show-secrets`` form: secrets carry ``plaintext``."""
    if isinstance(value, Secret):
        return {SIG_KEY: SECRET_SIG, "plaintext": json.dumps(plain(value.value), separators=(",", ":"))}
    if isinstance(value, dict):
        return {k: to_plaintext_state(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_plaintext_state(v) for v in value]
    return value
