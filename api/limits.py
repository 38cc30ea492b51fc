"""How much the operator records of one operation, so no object it writes grows with the program.

A Kubernetes object is at most 1.5 MiB in etcd (the API server's default request limit; a Secret's
data at most 1 MiB): a status write over it fails every time, and a Stack whose result cannot be
written is wedged. So every list the operator copies from Pulumi into a status (the resources an
Update changes, the drifted resources, pending operations), every message and the outputs Secret
are bounded here: the first entries in a stable order (sorted by URN), then a count of all of them
and a ``truncated`` marker. The whole list stays where a person can read it: the agent's log names
every change of every operation (``resource change`` lines), and the workspace pod answers
``pulumi stack export`` / ``pulumi stack output`` (``kubectl exec``) for the state and outputs.

Plain values, no pydantic: the controllers, the agent and the generated reference
(docs/reference/conditions.md, "Size bounds") read them from here.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "MAX_LISTED_BYTES",
    "MAX_LISTED_ENTRIES",
    "MAX_LISTED_PATHS",
    "MAX_MESSAGE_CHARS",
    "MAX_OBJECT_BYTES",
    "MAX_OUTPUTS_BYTES",
    "MAX_SHORT_MESSAGE_CHARS",
]

MAX_LISTED_ENTRIES: Final = 250
"""Entries listed in an Update's ``status.changes`` and ``status.pendingOperations``, a Stack's
``status.drift.resources``: the first ones by URN; ``changeCount`` / ``drift.count`` say how many there
are and ``changesTruncated`` / ``drift.truncated`` that some are left out."""
MAX_LISTED_PATHS: Final = 20
"""Property paths listed per resource in ``changes`` and ``drift.resources`` (the first, sorted); a
resource with more counts as truncated."""
MAX_LISTED_BYTES: Final = 128 * 1024
"""The JSON size of one listed status list (``changes``, ``drift.resources``, ``pendingOperations``):
entries stop before the one that would pass it, whatever their count (long URNs, many paths)."""
MAX_MESSAGE_CHARS: Final = 4096
"""Characters of an Update's ``status.message`` (the last lines of Pulumi's error output): the
agent's log holds all of it."""
MAX_SHORT_MESSAGE_CHARS: Final = 1024
"""Characters of a condition or Event message that names resources (``Drifted``, ``DriftDetected``)."""
MAX_OUTPUTS_BYTES: Final = 512 * 1024
"""Bytes (keys and JSON values) of the stack outputs an Update's outputs Secret holds, and so the
Stack's ``status.outputs``: outputs are taken by name while they fit, a larger one is left out and
named in the Secret's ``pulumi.com/omitted-outputs`` annotation (``pulumi stack output`` in the
workspace pod still shows it)."""
MAX_OBJECT_BYTES: Final = 1024 * 1024
"""What the bounds above keep every Stack, Update and outputs Secret under, as JSON (under etcd's
1.5 MiB and a Secret's 1 MiB with room for metadata): the 2,000-resource test and benchmark check it."""
