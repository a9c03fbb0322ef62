"""Who may publish into a scope and subscribe in one (seed 003's access control at the border), and
whether a sealed publication uses a key only the scope's members hold.

Publishing into a scope or subscribing in one takes membership: the registry's, or a scope named in
the attributes of the client's credentials. A subscription must also stay inside what may be asked
for: covered by one of the filters the client's attributes allow, if they state any, and by one of
the scope's `subscribe` filters, if it has them; otherwise it is refused before it exists, so a
curious client cannot even ask. A sealed publication must use the scope's newest key version, and
that version must not have been wrapped for anyone who has left the scope since, nor for a
recipient key the registry no longer lists: after a member leaves or changes its key, nothing is
accepted until the key is rotated.

Announcing for an edge broker is a privilege too, since the broker answers an announcement with the
filters of the subscriptions it could serve: the registry's `announce` section must cover it.
"""

from __future__ import annotations

from collections.abc import Sequence

from veil.matching import Predicate
from veil.matching.covering import covered_by_any
from veil.protocol import ProtocolError
from veil.protocol.reserved import ORIGIN, SCOPE, SEALED, Reserved
from veil.security.identity import Principal
from veil.security.registry import Registry
from veil.security.scopes import WORLD


def is_member(registry: Registry, principal: Principal, scope: str) -> bool:
    user = principal.identity
    return registry.scopes.is_member(scope, user, registry.groups_of(user), principal.attributes.scopes)


def admit_publication(registry: Registry, principal: Principal, reserved: Reserved) -> None:
    if reserved.origin is not None and reserved.origin != principal.identity:
        problem = f"names publisher {reserved.origin!r}; you are {principal.identity!r}"
        raise ProtocolError(ORIGIN, problem, 403)
    scope = reserved.scope
    if not is_member(registry, principal, scope):
        raise ProtocolError(SCOPE, f"you are not a member of scope {scope!r} (or there is no such scope)", 403)
    if reserved.sealed_version is not None:
        check_key_version(registry, scope, reserved.sealed_version)


def check_key_version(registry: Registry, scope: str, version: int) -> None:
    keys = registry.scopes.by_name[scope].keys
    if not keys:
        raise ProtocolError(SEALED, f"scope {scope!r} has no key yet: its manager stores one first", 409)
    newest = max(keys)
    if version != newest:
        stale = f"sealed under version {version} of scope {scope!r}'s key; the current one is {newest}"
        raise ProtocolError(SEALED, stale, 409)
    if scope not in registry.key_checks:  # once per registry version: a scope may have many members
        registry.key_checks[scope] = _holders_problem(registry, scope, newest)
    problem = registry.key_checks[scope]
    if problem is not None:
        raise ProtocolError(SEALED, problem, 409)


def _holders_problem(registry: Registry, scope: str, newest: int) -> str | None:
    holders = registry.scopes.by_name[scope].keys[newest].roster.members
    gone = sorted(set(holders) - registry.scopes.members(scope, registry.members))
    if gone:
        return (
            f"version {newest} of scope {scope!r}'s key is held by {len(gone)} former member(s), "
            f"{', '.join(gone[:3])}: its manager rotates the key first"
        )
    changed = sorted(m for m, public in holders.items() if registry.recipients.get(m) != public)
    if changed:
        return (
            f"version {newest} of scope {scope!r}'s key was wrapped for a recipient key that "
            f"{', '.join(changed[:3])} no longer has: its manager rotates the key first"
        )
    return None


def admit_subscription(
    registry: Registry, principal: Principal, predicates: Sequence[Predicate], scope: str | None
) -> bool:
    """Refuse (403) what the client may not ask for; True when only its attributes admit it to the
    scope (the pipeline cannot look those up later, so the subscription records it)."""
    scope = scope or WORLD
    user = principal.identity
    by_registry = registry.scopes.is_member(scope, user, registry.groups_of(user))
    if not by_registry and not is_member(registry, principal, scope):
        raise ProtocolError("scope", f"you are not a member of scope {scope!r} (or there is no such scope)", 403)
    allowed = principal.attributes.subscribe
    if allowed is not None and not covered_by_any(allowed, predicates):
        problem = f"not covered by any of the {len(allowed)} filters your credentials allow you to subscribe with"
        raise ProtocolError("data", problem, 403)
    bounds = registry.scopes.by_name[scope].subscribe if scope != WORLD else None
    if bounds is not None and not covered_by_any(bounds, predicates):
        raise ProtocolError("data", f"not covered by any of the {len(bounds)} filters scope {scope!r} allows", 403)
    return not by_registry


def admit_announcement(registry: Registry, principal: Principal, predicates: Sequence[Predicate]) -> None:
    """Refuse (403) an announcement that none of the filters the registry lets the client announce
    covers."""
    allowed = registry.announce_filters_of(principal.identity)
    if not allowed:
        raise ProtocolError("authHash", "may not announce: the registry's announce section allows you nothing", 403)
    if not covered_by_any(allowed, predicates):
        problem = f"not covered by any of the {len(allowed)} filters the registry lets you announce"
        raise ProtocolError("data", problem, 403)
