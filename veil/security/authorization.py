"""What a subscriber may receive of a publication (SPEC §6), one pair at a time: the reference
semantics that the pipeline's vectorised authorize stage is tested against, and the cropping of a
delivered copy.

A pair passes when the publication is visible in the subscription's scope and the subscriber is in
that scope (`security.scopes`), when (with authorization on) some rule of the subscriber, or of anyone ("*"), matches
the publication, and, if the publication matches policies of its publisher, the subscriber is in the
group of at least one of them ("*" = anyone, anonymous included), for the policies the admins set and
for those the publisher set itself, each on their own: a publisher's own cannot lift the admins'.
Cropping rules of the publisher that match the publication and name the subscriber or one of its
groups remove their fields.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from veil.matching import matches
from veil.protocol.reserved import scope_of
from veil.security.registry import ANYONE, Registry
from veil.security.scopes import WORLD


def decide(
    registry: Registry,
    with_authorization: bool,
    publisher: str,
    attributes: Mapping[str, object],
    subscriber: str,
    scope: str = WORLD,
    admitted: bool = False,
) -> tuple[bool, frozenset[str]]:
    """(may the subscriber receive it, the fields removed from its copy) for one matched pair; `scope`
    is the subscription's, `admitted` whether its owner's attributes admitted it there."""
    groups = registry.groups_of(subscriber)
    origin = scope_of(attributes)
    origin = WORLD if origin is None else origin
    reach = registry.scopes.reach(origin, attributes) if isinstance(origin, str) else frozenset()
    if scope not in reach:
        return False, frozenset()
    if not registry.scopes.is_member(scope, subscriber, groups, frozenset({scope}) if admitted else frozenset()):
        return False, frozenset()
    if with_authorization and not any(matches(list(rule), attributes) for rule in registry.rules_of(subscriber)):
        return False, frozenset()
    for policies in (registry.policies, registry.publisher_policies):  # the admins' hold whatever the publisher sets
        applying = [p for p in policies.get(publisher, ()) if matches(list(p.data), attributes)]
        if applying and not any(p.group == ANYONE or p.group in groups for p in applying):
            return False, frozenset()
    cropped = frozenset(
        name
        for crop in registry.cropping.get(publisher, ())
        if (subscriber in crop.users or crop.groups & groups) and matches(list(crop.data), attributes)
        for name in crop.fields
    )
    return True, cropped


def crop(body: bytes, fields: frozenset[str] | list[str]) -> bytes:
    """The publication without these fields; a dotted name also reaches into nested objects."""
    doc = orjson.loads(body)
    for name in fields:
        if isinstance(doc, dict) and name in doc:
            del doc[name]
        else:
            _remove(doc, name.split("."))
    return orjson.dumps(doc)


def _remove(doc: object, path: list[str]) -> None:
    if not isinstance(doc, dict):
        return
    head, rest = path[0], path[1:]
    if not rest:
        doc.pop(head, None)
    elif head in doc:
        _remove(doc[head], rest)
