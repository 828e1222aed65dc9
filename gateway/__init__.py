"""Sluice's gateway: the data plane (reverse proxy), admin plane, discovery and the composition root."""

__version__ = "0.1.0"
