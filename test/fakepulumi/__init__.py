"""A stand-in for the ``pulumi`` CLI, for tests only.

The real CLI cannot be installed on our machines, so tests drive this package through
``pulumi.automation`` exactly as the agent drives the real CLI. It answers the subcommands the
Automation API issues, keeps state in a file backend laid out like the real DIY backend, writes
engine events in the real JSON shape, and evaluates a small subset of Pulumi YAML. See README.md
for what is modelled and what is not. It never ships in an image.
"""
