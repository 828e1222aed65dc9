"""Data-plane worker processes (``workers: N``): the main process keeps the scaler, the admin
plane and the platform and supervises N workers that serve the data plane on the same ports
(``SO_REUSEPORT``); routes, endpoints, settings and hooks go down a socket to each worker,
their counters come back and are merged so a request is counted once."""
