"""Sluice's scaler: live service signals to replica and CPU decisions under one shared budget.

The pure core (``signals``, ``policy``, ``horizontal``, ``kpa_batch``, ``hpa``, ``budget``,
``engine``, ``explain``, ``decision``) does no I/O and reads no clock: time is passed in.
``loop`` and ``actuators`` are the I/O edge.  This package never imports ``gateway``.
"""
