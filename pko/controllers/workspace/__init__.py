"""The Workspace controller."""
