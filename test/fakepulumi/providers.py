"""Built-in resource types with deterministic, local behaviour.

``random`` types mimic pulumi-random's inputs and outputs; their results are derived from the URN
and inputs (seeded SHA-256), so a test can recompute them. Every input change replaces a random
resource (all its inputs are force-new, as in the real provider). ``test`` types exist for tests:

* ``test:index:Echo``  outputs = inputs; updates in place.
* ``test:index:Fail``  create and update fail with ``message`` (default ``"intentional failure"``).
* ``test:index:Hang``  create waits ``seconds`` (forever when unset) unless the operation is cancelled;
  a cancelled create fails with ``operation canceled`` and the resource is not created.
* ``test:index:Crash`` with ``crash`` true (the default), the CLI process dies (SIGKILL) in the middle
  of the create: the checkpoint keeps a pending ``creating`` operation and the stack lock stays, as
  after an OOM kill. With ``crash: false`` it behaves like Echo.
* ``test:index:Drift`` its "cloud" is the file at ``path`` (the id): output ``value`` is the file's text
  ("" if absent) when created, and ``refresh`` re-reads it, so a test can drift the resource out of band.

``refresh`` asks :meth:`Provider.refresh` for the current outputs (unchanged for every type but Drift)
and ``import`` asks :meth:`Provider.read` for the inputs and outputs of an existing id.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .values import UNKNOWN, Secret, plain

TYPE_ALIASES = {
    "random:RandomString": "random:index/randomString:RandomString",
    "random:index:RandomString": "random:index/randomString:RandomString",
    "random:RandomPassword": "random:index/randomPassword:RandomPassword",
    "random:index:RandomPassword": "random:index/randomPassword:RandomPassword",
    "random:RandomInteger": "random:index/randomInteger:RandomInteger",
    "random:index:RandomInteger": "random:index/randomInteger:RandomInteger",
    "random:RandomPet": "random:index/randomPet:RandomPet",
    "random:index:RandomPet": "random:index/randomPet:RandomPet",
    "random:RandomUuid": "random:index/randomUuid:RandomUuid",
    "random:index:RandomUuid": "random:index/randomUuid:RandomUuid",
    "test:Echo": "test:index:Echo",
    "test:Fail": "test:index:Fail",
    "test:Hang": "test:index:Hang",
    "test:Crash": "test:index:Crash",
    "test:Drift": "test:index:Drift",
}
PACKAGE_VERSIONS = {"random": "4.18.0", "test": "1.0.0"}


class ProviderError(Exception):
    """A resource operation failed; the message becomes the diagnostic."""


@dataclass
class OpContext:
    """What a provider may do besides computing: wait interruptibly, or kill the CLI mid-operation."""

    cancelled: threading.Event
    before_crash: Callable[[], None]

    def crash(self) -> None:
        self.before_crash()
        os.kill(os.getpid(), signal.SIGKILL)


class Provider:
    replace_on_change = True

    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def update(self, urn: str, id_: str, inputs: dict[str, Any], ctx: OpContext) -> dict[str, Any]:
        return self.create(urn, inputs, ctx)[1]

    def preview_outputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Outputs during preview: inputs are known, computed results are not."""
        return {**inputs, "result": UNKNOWN}

    def refresh(self, urn: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        """The resource's outputs as the cloud has them now; nothing drifts unless a type says so."""
        return outputs

    def read(self, urn: str, id_: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(inputs, outputs) of an existing resource for ``pulumi import``; None when it does not exist.

        Refused by default with the engine's text for a provider whose Read returns no inputs.
        """
        package = urn.split("::")[2].rsplit("$", 1)[-1].split(":", 1)[0]
        raise ProviderError(
            f"provider does not support importing resources; please try updating the '{package}' plugin"
        )


def _rng(urn: str, inputs: dict[str, Any]) -> hashlib._Hash:
    return hashlib.sha256((urn + json.dumps(plain(inputs), sort_keys=True)).encode("utf-8"))


def _stream(urn: str, inputs: dict[str, Any], count: int) -> list[int]:
    seed = _rng(urn, inputs).digest()
    out: list[int] = []
    counter = 0
    while len(out) < count:
        out.extend(hashlib.sha256(seed + counter.to_bytes(4, "big")).digest())
        counter += 1
    return out[:count]


class RandomString(Provider):
    secret_result = False

    def _result(self, urn: str, inputs: dict[str, Any]) -> str:
        p = plain(inputs)
        length = int(p.get("length", 0))
        if length <= 0:
            raise ProviderError("length must be a positive integer")
        chars = ""
        if p.get("lower", True):
            chars += "abcdefghijklmnopqrstuvwxyz"
        if p.get("upper", True):
            chars += "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
        if p.get("numeric", p.get("number", True)):
            chars += "0123456789"
        if p.get("special", True):
            chars += p.get("overrideSpecial") or "!@#$%&*()-_=+[]{}<>:?"
        if not chars:
            raise ProviderError("the character set is empty")
        return "".join(chars[b % len(chars)] for b in _stream(urn, inputs, length))

    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        result = self._result(urn, inputs)
        value: Any = Secret(result) if self.secret_result else result
        return ("none" if self.secret_result else result), {**inputs, "result": value}

    def preview_outputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {**inputs, "result": Secret(UNKNOWN) if self.secret_result else UNKNOWN}


class RandomPassword(RandomString):
    secret_result = True


class RandomInteger(Provider):
    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        p = plain(inputs)
        low, high = int(p.get("min", 0)), int(p.get("max", 0))
        if high < low:
            raise ProviderError("minimum value needs to be smaller than or equal to maximum value")
        seed = int.from_bytes(_rng(urn, inputs).digest()[:8], "big")
        result = low + seed % (high - low + 1)
        return str(result), {**inputs, "result": result}


_WORDS = ["amber", "brave", "calm", "eager", "fancy", "gentle", "happy", "jolly", "kind", "lucky"]
_PETS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "owl", "yak"]


class RandomPet(Provider):
    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        p = plain(inputs)
        length, sep = int(p.get("length", 2)), str(p.get("separator", "-"))
        data = _stream(urn, inputs, max(length, 1))
        words = [_WORDS[b % len(_WORDS)] for b in data[: length - 1]] + [_PETS[data[-1] % len(_PETS)]]
        if p.get("prefix"):
            words.insert(0, str(p["prefix"]))
        result = sep.join(words)
        return result, {**inputs, "id": result}

    def preview_outputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {**inputs, "id": UNKNOWN}


class RandomUuid(Provider):
    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        result = str(uuid.UUID(bytes=_rng(urn, inputs).digest()[:16], version=4))
        return result, {**inputs, "result": result}


class Echo(Provider):
    replace_on_change = False

    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        return "echo-" + _rng(urn, {}).hexdigest()[:12], dict(inputs)

    def preview_outputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(inputs)

    def read(self, urn: str, id_: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Any id exists and nothing is known about it: empty inputs and outputs."""
        return {}, {}


class Fail(Echo):
    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        raise ProviderError(str(plain(inputs).get("message", "intentional failure")))


class Hang(Echo):
    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        seconds = plain(inputs).get("seconds")
        if ctx.cancelled.wait(None if seconds is None else float(seconds)):
            raise ProviderError("operation canceled")
        return super().create(urn, inputs, ctx)


class Crash(Echo):
    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        if plain(inputs).get("crash", True):
            ctx.crash()
        return super().create(urn, inputs, ctx)


class Drift(Provider):
    """A resource whose cloud value lives in a file the test controls (see the module docstring)."""

    replace_on_change = False

    @staticmethod
    def _path(inputs: dict[str, Any]) -> str:
        path = plain(inputs).get("path")
        if not isinstance(path, str) or not path:
            raise ProviderError("missing required property 'path'")
        return path

    def create(self, urn: str, inputs: dict[str, Any], ctx: OpContext) -> tuple[str, dict[str, Any]]:
        path = self._path(inputs)
        return path, {**inputs, "value": _file_text(path) or ""}

    def preview_outputs(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {**inputs, "value": UNKNOWN}

    def refresh(self, urn: str, id_: str, inputs: dict[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        return {**outputs, "value": _file_text(id_) or ""}

    def read(self, urn: str, id_: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The id is the path; a missing file is a resource that does not exist."""
        text = _file_text(id_)
        if text is None:
            return None
        return {"path": id_}, {"path": id_, "value": text}


def _file_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


PROVIDERS: dict[str, Provider] = {
    "random:index/randomString:RandomString": RandomString(),
    "random:index/randomPassword:RandomPassword": RandomPassword(),
    "random:index/randomInteger:RandomInteger": RandomInteger(),
    "random:index/randomPet:RandomPet": RandomPet(),
    "random:index/randomUuid:RandomUuid": RandomUuid(),
    "test:index:Echo": Echo(),
    "test:index:Fail": Fail(),
    "test:index:Hang": Hang(),
    "test:index:Crash": Crash(),
    "test:index:Drift": Drift(),
}


def canonical_type(token: str) -> str:
    return TYPE_ALIASES.get(token, token)


def provider_for(token: str) -> Provider | None:
    return PROVIDERS.get(canonical_type(token))
