"""Operator tools beside the gateway: the load generator, the live terminal view, the demo app."""
