"""The bundled demo app: a tiny HTTP/1.1 server whose requests burn a chosen amount of CPU.

Run as ``python -m gateway.tools.demo --port N``.  Standard library only, starts in milliseconds.
See :mod:`gateway.tools.demo.server`.
"""
