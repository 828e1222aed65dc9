"""The data plane: a streaming HTTP/1.1 reverse proxy on asyncio Protocols (uvloop + httptools).

Small modules: ``server`` (HTTP/1.1 in), ``upstream`` (pooled HTTP/1.1 out), ``forward``
(one request end to end), ``headers`` (hop-by-hop, Via, X-Forwarded-*), ``errors``
(causes -> status + ``Sluice-Error``).  See docs/dataplane.md.
"""

from gateway.dataplane.server import DataPlane, Routing

__all__ = ["DataPlane", "Routing"]
