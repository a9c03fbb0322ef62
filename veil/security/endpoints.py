"""Where a broker may send requests on a client's behalf (webhooks): public addresses only, unless
the operator allows a network. A client naming its endpoint could otherwise have the broker reach
what only the broker can: loopback services, the cloud's metadata address, the private network.

An IPv6 address that carries an IPv4 one (IPv4-mapped, NAT64, 6to4, Teredo) is judged by both: a
public-looking IPv6 address must not smuggle a private IPv4 one through a translator."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # the well-known prefix (RFC 6052)
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # local-use translators (RFC 8215)
COMPATIBLE = ipaddress.IPv6Network("::/96")  # IPv4-compatible (deprecated, still routed by some stacks)
SIIT = ipaddress.IPv6Network("::ffff:0:0:0/96")  # IPv4-translated (RFC 2765)


def networks(texts: Iterable[str], option: str) -> tuple[Network, ...]:
    """The operator's allowlist (`option` names it in errors)."""
    found = []
    for text in texts:
        try:
            found.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{option}: {text!r} is not a network (CIDR, e.g. 10.0.0.0/8)") from None
    return tuple(found)


def _carried(address: Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 one carries (to a translator, a relay or a dual stack)."""
    found: list[ipaddress.IPv4Address] = []
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            found.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            found.append(address.sixtofour)
        if address.teredo is not None:
            found.extend(address.teredo)
        if any(address in network for network in (NAT64, NAT64_LOCAL, COMPATIBLE, SIIT)):
            found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def allowed(address: Address | str, allow: Sequence[Network]) -> bool:
    """Whether a request may go to this address: it is in a network the operator allows, or public;
    one that carries IPv4 addresses, if each of those is."""
    parsed = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.scope_id:
        parsed = ipaddress.IPv6Address(str(parsed).split("%")[0])
    if any(parsed in network for network in allow if parsed.version == network.version):
        return True
    inner = _carried(parsed)
    if inner:
        return all(allowed(one, allow) for one in inner)
    site_local = isinstance(parsed, ipaddress.IPv6Address) and parsed.is_site_local
    return parsed.is_global and not (parsed.is_multicast or parsed.is_reserved or site_local)
