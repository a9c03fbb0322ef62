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

A client that may not see a scope gets the answer it would get for a scope that does not exist, so
that the names of scopes (and their key versions) are not learned by trying them.
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


def _version(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) < 10):
        raise ProtocolError("version", "a key version is a whole number from 1")
    return int(text)


def _managed(registry: Registry, user: str, name: str) -> Scope:
    """The scope, if `user` manages it or is an administrator."""
    scope = registry.scopes.by_name.get(name)
    if scope is None or (user not in scope.managers and user not in registry.admins):
        raise ProtocolError("scope", f"no scope {name!r} that you manage (or administer)", 404)
    return scope


@routes.get("/scopes/{scope}")
async def describe(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    user = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    registry = gateway.registry.current
    scope = _managed(registry, user, request.match_info["scope"])
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
        scope = _managed(registry, user, name)
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
    name = request.match_info["scope"]
    scope = gateway.registry.current.scopes.by_name.get(name)
    asked = request.query.get("version")
    version = _version(asked) if asked is not None else max(scope.keys if scope else (), default=0)
    wrapped = scope.keys.get(version, {}).get(user) if scope else None
    if wrapped is None:  # the version only when asked for: the newest is not told to those without it
        which = f"version {asked} of " if asked is not None else ""
        raise ProtocolError("version", f"no envelope of {which}scope {name!r} for you", 404)
    body = {"scope": name, "version": version, "envelope": base64.b64encode(wrapped).decode()}
    return json_response(body)
