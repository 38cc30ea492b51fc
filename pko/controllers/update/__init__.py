"""The Update controller."""
