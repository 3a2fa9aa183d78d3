"""The proxy the environment names for a store URL: the aiohttp pool's, by httpx's rules.

The package has one proxy behaviour (client/README.md#proxies): `HTTP_PROXY`
and `HTTPS_PROXY` for their scheme, `ALL_PROXY` for either when the
scheme's own is unset, `NO_PROXY` naming hosts reached directly (`*` for
every host; `example.com` also covers its subdomains, `.example.com` only
them). That is what httpx's pools (the staging classes, `FinalizerClient`,
the service's `http` source) read. aiohttp's `trust_env` would also read
`.netrc` and send its password to the store (issue 29), and ignores
`ALL_PROXY`: so the aiohttp pool reads the environment only through here.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit
from urllib.request import getproxies

__all__ = ["environment_proxy"]


def _bypassed(host: str, no_proxy: str) -> bool:
    """Whether `NO_PROXY` (comma-separated) names `host` for direct connections."""
    host = host.lower().strip("[]")
    for entry in (part.strip().lower() for part in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if "://" in entry:  # a scheme-qualified entry, as httpx reads it: its host part
            entry = urlsplit(entry).hostname or ""
        entry = entry.strip("[]")
        if _is_address(entry) or entry == "localhost":
            if host == entry:
                return True
        elif entry.startswith("."):
            if host.endswith(entry):
                return True
        elif host == entry or host.endswith(f".{entry}"):
            return True
    return False


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def environment_proxy(url: str) -> str | None:
    """The proxy URL the environment names for `url`, or None to connect directly.

    A proxy given without a scheme is an `http://` one (as httpx reads it).
    """
    parts = urlsplit(url)
    proxies = getproxies()  # *_proxy variables, either case (lower case first)
    if _bypassed(parts.hostname or "", proxies.get("no", "")):
        return None
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy:
        return None
    return proxy if "://" in proxy else f"http://{proxy}"
