"""The Stack controller."""
