"""The data plane: a streaming HTTP/1.1 reverse proxy on asyncio Protocols (uvloop + httptools).

Small modules: ``server`` (HTTP/1.1 in), ``upstream`` (pooled HTTP/1.1 out), ``forward``
(one request end to end), ``headers`` (hop-by-hop, Via, X-Forwarded-*), ``errors``
(causes -> status + ``Sluice-Error``), ``routing``, ``admission``, ``balancers``,
``endpoints``, ``outlier``, ``retry``, ``service``, ``stats``, and ``updates`` (what
platforms hand the data plane). See docs/dataplane.md.
"""
