"""The Program controller."""
