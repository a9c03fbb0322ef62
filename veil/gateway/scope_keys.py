"""Scope keys through the broker (SPEC §7): a scope's manager stores each version of the key as a
roster it signed (`security.rosters`) with an envelope for every member on it, and a member
fetches its own envelope with the signed roster, which it verifies against the managers' keys it
pins. The broker keeps and hands out envelopes it cannot open; the registry holds them, so every
gateway and the log agree on which versions exist. The gateway checks what it stores (the roster
signed with a key the registry lists for the manager storing it, for members the registry lists with the
recipient keys it lists), but clients believe the signature, not the gateway. Two managers storing
at once through any gateways are serialized by the registry's version (`gateway.registry`): the
second gets 409. The admin API does not store keys: an administrator's registry keeps them as they
are (`keep_scope_keys`).

    GET /scopes/{scope}                 manager: the newest version's signed roster, and each member's
                                        recipient key as the registry lists it
    PUT /scopes/{scope}/keys/{version}  manager: {"roster", "keyId", "signature", "envelopes"}, the next
                                        version; envelopes of older versions are kept only for members
                                        still on the new roster
    GET /scopes/{scope}/key[?version=N] member: {"scope", "version", "envelope", "roster", "keyId",
                                        "signature"} (the newest by default)

A client that may not see a scope gets the answer it would get for a scope that does not exist, so
that the names of scopes (and their key versions) are not learned by trying them. Envelopes are
served only to the scope's current members.
"""

from __future__ import annotations

import base64
from typing import Any

from aiohttp import web

from veil.gateway.context import GATEWAY
from veil.gateway.errors import json_response
from veil.gateway.http import body_of, client_of, parsed
from veil.gateway.registry import VERSION_HEADER, base_version
from veil.protocol import ProtocolError
from veil.protocol.limits import load_json
from veil.security.registry import Registry
from veil.security.scopes import KeyVersion, Scope, key_version

routes = web.RouteTableDef()


def _version(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) < 10):
        raise ProtocolError("version", "a key version is a whole number from 1")
    return int(text)


def _managed(registry: Registry, user: str, name: str) -> Scope:
    """The scope, if `user` is one of its managers."""
    scope = registry.scopes.by_name.get(name)
    if scope is None or user not in scope.managers:
        raise ProtocolError("scope", f"no scope {name!r} that you manage", 404)
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
    newest = max(scope.keys, default=0)
    roster = scope.keys[newest].signed.document() if newest else None
    return json_response({"scope": scope.name, "version": newest, "members": recipients, "roster": roster})


@routes.put("/scopes/{scope}/keys/{version}")
async def store_version(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    user = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    name, version = request.match_info["scope"], _version(request.match_info["version"])
    doc = await parsed(gateway, await body_of(gateway, request), load_json, "body", gateway.limits)
    stored = key_version(name, version, doc, "body")
    roster = stored.roster
    missing = sorted(set(roster.members) - set(stored.envelopes))
    if missing:
        raise ProtocolError(f"body.envelopes.{missing[0]}", "every member on the roster gets its envelope")

    def change(registry: Registry, document: dict) -> None:
        scope = _managed(registry, user, name)
        _check_signed(registry, user, stored)
        newest = max(scope.keys, default=0)
        if version != newest + 1:
            raise ProtocolError("version", f"the next version is {newest + 1}", 409)
        members = registry.scopes.members(name, registry.members)
        for member, public in roster.members.items():
            if member not in members:
                raise ProtocolError(f"body.roster.members.{member}", f"not a member of scope {name!r}", 409)
            if registry.recipients.get(member) != public:
                problem = "not the recipient key the registry lists for this member"
                raise ProtocolError(f"body.roster.members.{member}", problem, 409)
        entry = document["scopes"][name] if document["scopes"][name] is not None else {}
        document["scopes"][name] = entry
        keys = entry.setdefault("keys", {})
        for older in keys.values():  # a member who left gets none of the versions it held
            older["envelopes"] = {m: e for m, e in older.get("envelopes", {}).items() if m in roster.members}
        keys[str(version)] = stored.document()

    _, registry_version = await gateway.registry.amend(change, base_version(request))
    response = json_response({"scope": name, "version": version})
    response.headers[VERSION_HEADER] = str(registry_version)
    return response


def _check_signed(registry: Registry, user: str, stored: KeyVersion) -> None:
    """Signed by this manager, with a key the registry lists for it: a gateway refuses what no client
    would believe (clients check the signature against keys they pin, not these)."""
    signed = stored.signed
    if signed.key_id not in registry.keys.get(user, {}):
        raise ProtocolError("body.keyId", f"no signing key {signed.key_id!r} is registered for you", 403)
    if not signed.verified_by(registry.keys[user]):
        raise ProtocolError("body.signature", "does not verify over the roster with your key: refused", 403)


@routes.get("/scopes/{scope}/key")
async def envelope(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    user = client_of(gateway, request, request.headers.get("X-Auth-Hash"))
    name = request.match_info["scope"]
    registry = gateway.registry.current
    scope = registry.scopes.by_name.get(name)
    current = scope is not None and user in registry.scopes.members(name, registry.members)
    asked = request.query.get("version")
    version = _version(asked) if asked is not None else max(scope.keys if scope else (), default=0)
    stored = scope.keys.get(version) if scope and current else None
    wrapped = stored.envelopes.get(user) if stored else None
    if stored is None or wrapped is None:  # the version only when asked for: the newest is not told
        which = f"version {asked} of " if asked is not None else ""
        raise ProtocolError("version", f"no envelope of {which}scope {name!r} for you", 404)
    body = {"scope": name, "version": version, "envelope": base64.b64encode(wrapped).decode()}
    return json_response({**body, **stored.signed.document()})


def keep_scope_keys(stored: dict[str, Any], document: dict[str, Any]) -> None:
    """An administrator's registry `document` keeps the scope keys of the `stored` one as they are:
    a scope's keys left out are carried over, and keys that differ are refused (403), so that no
    administrator installs an envelope or a roster (clients would refuse an unsigned one, but a
    broker that serves it stops a scope's sealed traffic)."""
    scopes = document.get("scopes")
    kept = stored.get("scopes")
    held: dict[str, Any] = kept if isinstance(kept, dict) else {}
    if not isinstance(scopes, dict):
        return  # no scopes, or not an object: parsing names the mistake
    for name, entry in scopes.items():
        keys = (held.get(name) or {}).get("keys") if isinstance(held.get(name), dict) else None
        if entry is None and keys:
            scopes[name] = entry = {}
        if not isinstance(entry, dict):
            continue
        if "keys" not in entry:
            if keys:
                entry["keys"] = keys
        elif entry["keys"] != (keys or {}):
            problem = f"stored by the scope's managers, signed (PUT /scopes/{name}/keys/{{version}}), not here"
            raise ProtocolError(f"scopes.{name}.keys", problem, 403)
