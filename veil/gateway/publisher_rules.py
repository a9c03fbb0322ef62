"""Publisher self-service (seed 001 §III-C): a publisher reads and replaces the subscription
policies and cropping rules it sets on its own publications without admin rights, and can reach no
one else's: they are its entry of the registry's `publishers` section, and only the caller's own
entry is touched. The policies and cropping rules the admins set on its publications (the
`policies` and `cropping` sections) hold beside its own, and it can neither change nor lift them.

    GET /publisher/rules   -> {"policies": [...], "cropping": [...], "admins": {"policies", "cropping"}}
    PUT /publisher/rules   <- {"policies": [...], "cropping": [...]}; a missing section is left as it is

Every change is a new registry version in the log, like an admin's, so it applies to publications
logged after it. A publisher's rules are bounded in size (`--max-publisher-rules`): every version is
a whole copy of the registry, which every gateway and the pipeline parse.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from veil.gateway.context import GATEWAY, Gateway
from veil.gateway.errors import json_response
from veil.gateway.http import body_of, client_of, parsed
from veil.gateway.registry import VERSION_HEADER, base_version
from veil.protocol import ProtocolError
from veil.protocol.limits import load_json
from veil.security.registry import ANONYMOUS, PUBLISHER_SECTIONS, Registry

routes = web.RouteTableDef()


def _publisher(gateway: Gateway, request: web.Request) -> str:
    publisher = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    if publisher == ANONYMOUS:
        raise ProtocolError("authHash", "anonymous publishers have no rules of their own: authenticate", 403)
    return publisher


def _answer(registry: Registry, version: int, publisher: str) -> web.Response:
    own = registry.document.get("publishers", {}).get(publisher) or {}
    body = {section: own.get(section, []) for section in PUBLISHER_SECTIONS}
    body["admins"] = {section: registry.document.get(section, {}).get(publisher, []) for section in PUBLISHER_SECTIONS}
    response = json_response(body)
    response.headers[VERSION_HEADER] = str(version)
    return response


@routes.get("/publisher/rules")
async def read(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    current = gateway.registry
    return _answer(current.current, current.version, _publisher(gateway, request))


@routes.put("/publisher/rules")
async def replace(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    publisher = _publisher(gateway, request)
    base = base_version(request)
    raw = await body_of(gateway, request)
    doc = await parsed(gateway, raw, load_json, "body", gateway.limits)
    if not isinstance(doc, dict) or not set(doc) <= set(PUBLISHER_SECTIONS):
        raise ProtocolError("body", 'an object with "policies" and/or "cropping" (lists of your rules)')
    limit = gateway.config.max_publisher_rules

    def change(_: Registry, document: dict) -> None:
        own = dict(document.setdefault("publishers", {}).get(publisher) or {})
        own.update({section: doc[section] for section in PUBLISHER_SECTIONS if section in doc})
        size = len(orjson.dumps(own))
        if size > limit:
            raise ProtocolError(
                "body", f"your policies and cropping rules would take {size} bytes, over the limit of {limit} "
                "(--max-publisher-rules)", 413,
            )  # fmt: skip
        document["publishers"][publisher] = own

    return _answer(*await gateway.registry.amend(change, base), publisher)
