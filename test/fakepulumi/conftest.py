"""Registers the ``fake_pulumi`` fixture for this package's own tests."""

from .fixtures import fake_pulumi

__all__ = ["fake_pulumi"]
