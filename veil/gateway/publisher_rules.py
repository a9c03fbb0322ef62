"""Publisher self-service (seed 001 §III-C): a publisher reads and replaces the subscription
policies and cropping rules of its own publications without admin rights, and can reach no one
else's: the registry sections are keyed by publisher, and only the caller's own key is touched.

    GET /publisher/rules   -> {"policies": [...], "cropping": [...]}   (the caller's)
    PUT /publisher/rules   <- the same shape; a missing section is left as it is

Every change is a new registry version in the log, like an admin's, so it applies to publications
logged after it.
"""

from __future__ import annotations

from aiohttp import web

from veil.gateway.context import GATEWAY, Gateway
from veil.gateway.errors import json_response
from veil.gateway.http import body_of, client_of, parsed
from veil.protocol import ProtocolError
from veil.protocol.limits import load_json
from veil.security.registry import ANONYMOUS, Registry

SECTIONS = ("policies", "cropping")
routes = web.RouteTableDef()


def _publisher(gateway: Gateway, request: web.Request) -> str:
    publisher = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    if publisher == ANONYMOUS:
        raise ProtocolError("authHash", "anonymous publishers have no rules of their own: authenticate", 403)
    return publisher


def _own(registry: Registry, publisher: str) -> dict[str, list]:
    return {section: registry.document.get(section, {}).get(publisher, []) for section in SECTIONS}


@routes.get("/publisher/rules")
async def read(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    return json_response(_own(gateway.registry.current, _publisher(gateway, request)))


@routes.put("/publisher/rules")
async def replace(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    publisher = _publisher(gateway, request)
    doc = await parsed(gateway, await body_of(gateway, request), load_json, "body", gateway.limits)
    if not isinstance(doc, dict) or not set(doc) <= set(SECTIONS):
        raise ProtocolError("body", 'an object with "policies" and/or "cropping" (lists of your rules)')

    def change(_: Registry, document: dict) -> None:
        for section in SECTIONS:
            if section in doc:
                document.setdefault(section, {})[publisher] = doc[section]

    registry = await gateway.registry.amend(change)
    return json_response(_own(registry, publisher))
