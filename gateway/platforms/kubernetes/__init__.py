"""The kubernetes platform: Ingress routes, EndpointSlice endpoints, /scale and pods/resize, Lease leadership, peer signals.

Only ``api`` imports the official ``kubernetes`` client; everything else sees typed structures.
"""
