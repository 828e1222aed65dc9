"""The one parser of addresses given on the command line (``--admin``, ``--target``).

Each accepts ``host:port``, ``[v6]:port`` and a URL (``http://host:port``, with a path kept
for ``--admin`` behind a prefix); ``host`` alone takes the default port.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Address:
    scheme: str
    host: str
    """Without brackets (``::1``, not ``[::1]``)."""
    port: int
    path: str = ""

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        """``scheme://host:port[/path]`` with no trailing slash."""
        return f"{self.scheme}://{self.netloc}{self.path}".rstrip("/")


def parse_address(text: str, default_port: int | None = None) -> Address:
    """``host:port`` or ``scheme://host:port[/path]``; raises ValueError saying what is wrong."""
    raw = text.strip()
    if not raw:
        raise ValueError("an address must not be empty")
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r}: the scheme must be http or https, got {parts.scheme!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r}: the port must be a number in 0..65535") from None
    host = parts.hostname
    if not host:
        raise ValueError(f"{text!r}: no host (expected host:port or http://host:port)")
    if port is None:
        if default_port is None:
            raise ValueError(f"{text!r}: no port (expected host:port or http://host:port)")
        port = default_port
    return Address(parts.scheme, host, port, parts.path.rstrip("/"))


def address_argument(text: str) -> Address:
    """``type=`` for argparse: a bad address is a usage error (exit 2), not a traceback."""
    try:
        return parse_address(text, default_port=80)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_admin_arguments(parser: argparse.ArgumentParser) -> None:
    """``--admin`` and ``--token``: how a CLI command reaches a running gateway's admin API."""
    parser.add_argument(
        "--admin",
        type=address_argument,
        help="admin API: host:port or http://host:port (default: the config's admin section)",
    )
    parser.add_argument(
        "--token", help="admin bearer token (default: $SLUICE_ADMIN_TOKEN, then the config's)"
    )
