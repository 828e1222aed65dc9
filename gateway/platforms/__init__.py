"""gateway/platforms."""
