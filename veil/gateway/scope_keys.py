"""Scope keys through the broker (SPEC §7): a scope's manager stores each version of the key wrapped
for every member (`security.sealing.wrap`), and a member fetches the envelope wrapped for itself.
The broker keeps and hands out envelopes it cannot open; the registry holds them, so every gateway
and the log agree on which versions exist and who holds them. Two managers storing at once through
any gateways are serialized by the registry's version (`gateway.registry`): the second is checked
against what the first stored, so it adds its envelopes beside the first's or gets 409.

    GET /scopes/{scope}                 manager: the newest version, each member's recipient key
    PUT /scopes/{scope}/keys/{version}  manager: {"envelopes": {member: base64}}; the next version,
                                        or the newest one again to add envelopes for new members
    GET /scopes/{scope}/key[?version=N] member: {"scope", "version", "envelope"} (newest by default)
"""

from __future__ import annotations

import base64

from aiohttp import web

from veil.gateway.context import GATEWAY
from veil.gateway.errors import json_response
from veil.gateway.http import body_of, client_of, parsed
from veil.gateway.registry import VERSION_HEADER, base_version
from veil.protocol import ProtocolError
from veil.protocol.limits import load_json
from veil.security.registry import Registry
from veil.security.scopes import Scope, envelope_bytes

routes = web.RouteTableDef()


def _scope(registry: Registry, name: str) -> Scope:
    scope = registry.scopes.by_name.get(name)
    if scope is None:
        raise ProtocolError("scope", f"no scope {name!r} in the registry", 404)
    return scope


def _version(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) < 10):
        raise ProtocolError("version", "a key version is a whole number from 1")
    return int(text)


def _manage(registry: Registry, user: str, scope: Scope) -> None:
    if user not in scope.managers and user not in registry.admins:
        raise ProtocolError("authHash", f"not a manager of scope {scope.name!r} or an administrator", 403)


@routes.get("/scopes/{scope}")
async def describe(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    user = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    registry = gateway.registry.current
    scope = _scope(registry, request.match_info["scope"])
    _manage(registry, user, scope)
    members = registry.scopes.members(scope.name, registry.members)
    recipients = {
        member: base64.b64encode(registry.recipients[member]).decode() if member in registry.recipients else None
        for member in sorted(members)
    }
    return json_response({"scope": scope.name, "version": max(scope.keys, default=0), "members": recipients})


@routes.put("/scopes/{scope}/keys/{version}")
async def store_version(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    user = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    name, version = request.match_info["scope"], _version(request.match_info["version"])
    doc = await parsed(gateway, await body_of(gateway, request), load_json, "body", gateway.limits)
    envelopes = doc.get("envelopes") if isinstance(doc, dict) else None
    if not isinstance(envelopes, dict) or not envelopes:
        raise ProtocolError("envelopes", "an object: member -> base64 envelope of the scope key for that member")
    for member, envelope in envelopes.items():
        envelope_bytes(envelope, f"envelopes.{member}")

    def change(registry: Registry, document: dict) -> None:
        scope = _scope(registry, name)
        _manage(registry, user, scope)
        newest = max(scope.keys, default=0)
        if version not in (newest, newest + 1) or version == 0:
            raise ProtocolError("version", f"the next version is {newest + 1} (or {newest}, to add members)", 409)
        strangers = sorted(set(envelopes) - registry.scopes.members(name, registry.members))
        if strangers:
            raise ProtocolError(f"envelopes.{strangers[0]}", f"not a member of scope {name!r}", 409)
        stored = document["scopes"][name] if document["scopes"][name] is not None else {}
        document["scopes"][name] = stored
        held = stored.setdefault("keys", {}).setdefault(str(version), {})
        replaced = sorted(set(held) & set(envelopes))
        if replaced:
            raise ProtocolError(f"envelopes.{replaced[0]}", f"already holds version {version}: rotate instead", 409)
        held.update(envelopes)

    _, stored = await gateway.registry.amend(change, base_version(request))
    response = json_response({"scope": name, "version": version})
    response.headers[VERSION_HEADER] = str(stored)
    return response


@routes.get("/scopes/{scope}/key")
async def envelope(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    user = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    scope = _scope(gateway.registry.current, request.match_info["scope"])
    asked = request.query.get("version")
    version = _version(asked) if asked is not None else max(scope.keys, default=0)
    wrapped = scope.keys.get(version, {}).get(user)
    if wrapped is None:
        raise ProtocolError("version", f"no envelope of version {version} of scope {scope.name!r} for you", 404)
    body = {"scope": scope.name, "version": version, "envelope": base64.b64encode(wrapped).decode()}
    return json_response(body)
