"""Which names a request may give the dashboard (and the metrics, on a loopback address): their defence against DNS
rebinding.

A page of another site can point a name of its own at the dashboard's address (DNS rebinding). To the
browser the dashboard is then the same origin as that page, so the action header no longer stops it: the
page may read and act as the user's browser. What the page cannot change is the name the browser writes
into `Host` (and `Origin`): its own. So every request's `Host` must name the dashboard:

- an IP address (any port): a browser that reached the dashboard by its address was not sent there by a
  name someone else controls;
- `localhost` (any port: an SSH tunnel may forward another local port), which no site can point anywhere;
- the host of the `dashboard` address it listens on;
- one of `dashboard_hosts`, as "NAME" (any port) or "NAME:PORT" (that port only; 80 when the Host has none).

A request without `Host` (HTTP/1.0; no browser sends one) is let through. An action's `Origin`, when
present, must name the dashboard by the same rule; `null` (a sandboxed or local page) never does.

Pure functions: the names in, a reason to refuse (or None) out.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable
from urllib.parse import urlsplit

# Longest Host or Origin quoted back in a refusal: the request head may hold 16 KiB of it.
QUOTED_CHARS = 100
LOOPBACK_NAMES = frozenset({"localhost"})


def split_authority(authority: str, default_port: int | None = None) -> tuple[str, int | None] | None:
    """("name", port) of "name[:port]" or "[v6]:port", the name lower-case without a final dot; None if malformed."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        name, bracket, rest = authority[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text = authority.partition(":")
        if not colon:
            port_text = None
    if port_text is None:
        return name.rstrip("."), default_port
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        return None
    return name.rstrip("."), int(port_text)


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether a listening address's host ("127.0.0.1", "[::1]", "localhost") is a loopback one."""
    name = host.strip("[]").lower()
    return name in LOOPBACK_NAMES or (is_address(name) and ipaddress.ip_address(name).is_loopback)


def names_the_server(authority: str, served_host: str | None, configured: Iterable[str],
                     default_port: int = 80) -> bool:
    """Whether `authority` (a Host header's value, or an Origin's host[:port]) names the server listening on
    `served_host` (the dashboard, or the metrics): an address, localhost, that host, or one of `configured`."""
    parsed = split_authority(authority, default_port)
    if parsed is None or not parsed[0]:
        return False
    name, port = parsed
    if is_address(name) or name in LOOPBACK_NAMES:
        return True
    if served_host is not None and name == served_host.strip("[]").lower().rstrip("."):
        return True
    for entry in configured:
        allowed = split_authority(entry)
        if allowed is not None and allowed[0] == name and allowed[1] in (None, port):
            return True
    return False


def host_problem(host: str | None, served_host: str | None, configured: Iterable[str]) -> str | None:
    """Why a request with this Host header is refused (421), or None."""
    if host is None or names_the_server(host, served_host, configured):
        return None
    return (f"this dashboard does not answer to the name {quoted(host)} (the Host header), so that another site "
            f"pointing its own name at this address (DNS rebinding) cannot use it. It answers to its IP addresses, "
            f"localhost{'' if served_host is None else ', ' + served_host} and the names in [broker] "
            f"dashboard_hosts: add the name you reach it by there")


def origin_problem(origin: str | None, served_host: str | None, configured: Iterable[str]) -> str | None:
    """Why an action with this Origin header is refused (403), or None."""
    if origin is None:
        return None
    parts = urlsplit(origin.strip())
    if parts.scheme in ("http", "https") and parts.netloc and not parts.path.strip("/"):
        default_port = 443 if parts.scheme == "https" else 80
        if names_the_server(parts.netloc, served_host, configured, default_port):
            return None
    return (f"an action from the page of {quoted(origin)} (the Origin header) is refused: only the dashboard's "
            f"own page may act (it is reached by an IP address, localhost or a name in [broker] dashboard_hosts)")


def quoted(text: str) -> str:
    """`text` in quotes, cut to QUOTED_CHARS: for a refusal that names what the peer sent."""
    return repr(text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + "…")


__all__ = ["host_problem", "is_loopback", "names_the_server", "origin_problem", "quoted", "split_authority"]
