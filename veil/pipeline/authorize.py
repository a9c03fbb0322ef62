"""The authorize stage (SPEC §1 step 3, §6), inside the match task, on the pairs matching produced.

Rules, policies and cropping rules are content filters, so each kind is filed in subscription
indexes of its own and matched against the same batch of publications: a batch costs a few index
calls, and the per-pair work is numpy set membership on (publication, user) keys. Only the rare
pairs that get a cropped copy cost Python per pair. `security.authorization.decide` states the same
semantics one pair at a time; the tests hold the two to each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from veil.matching import SubscriptionIndex
from veil.pipeline.numbering import user_number, users_numbered
from veil.pipeline.visibility import Visibility
from veil.security.authorization import crop
from veil.security.registry import ANYONE, Policy, Registry

EVERYONE = -2  # the number a rule for "*" is filed under
RULE_CHUNK = 16  # rules per user checked together


class _Targets:
    """Per filed entry (policy or cropping rule): its publisher and the users it names, as flat numpy
    arrays that a batch of (publication, entry) hits expands into (publication, user) keys."""

    def __init__(self) -> None:
        self.publishers: list[int] = []
        self.open: list[bool] = []
        self.starts: list[int] = []
        self.lengths: list[int] = []
        self.users: list[int] = []

    def add(self, publisher: str, users: Sequence[str], open_to_all: bool = False) -> int:
        self.publishers.append(user_number(publisher))
        self.open.append(open_to_all)
        self.starts.append(len(self.users))
        self.lengths.append(len(users))
        self.users.extend(sorted(user_number(u) for u in users))
        return len(self.publishers) - 1

    def freeze(self) -> None:
        self.publisher_of = np.array(self.publishers, np.int64)
        self.open_of = np.array(self.open, bool)
        self.start_of = np.array(self.starts, np.int64)
        self.length_of = np.array(self.lengths, np.int64)
        self.user_of = np.array(self.users, np.int64)

    def hits(self, index: SubscriptionIndex, documents: Sequence[dict], publishers: np.ndarray):
        """(publication, entry) pairs of entries that match a publication of their own publisher."""
        pubs, slots = index.match_pairs(documents)
        entries = index.numbers(slots)
        own = self.publisher_of[entries] == publishers[pubs]
        return pubs[own], entries[own]

    def keys(self, pubs: np.ndarray, entries: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The (publication, user) keys the hits name, and the entry each key came from."""
        lengths = self.length_of[entries]
        total = int(lengths.sum())
        offsets = np.cumsum(lengths) - lengths
        picks = np.repeat(self.start_of[entries] - offsets, lengths) + np.arange(total)
        return np.repeat(pubs, lengths) * width + self.user_of[picks], np.repeat(entries, lengths)


class _Policies:
    """One set of publishers' policies: a pair passes when no policy of the set applies to its
    publication, or one that applies names its subscriber's group (or anyone)."""

    def __init__(self, registry: Registry, policies: dict[str, tuple[Policy, ...]]) -> None:
        self.index = SubscriptionIndex()
        self.targets = _Targets()
        for publisher, listed in policies.items():
            for policy in listed:
                members = registry.members.get(policy.group, frozenset())
                entry = self.targets.add(publisher, sorted(members), open_to_all=policy.group == ANYONE)
                self.index.add(str(entry), policy.data, entry)
        self.targets.freeze()

    def allowed(
        self, documents: Sequence[dict], publishers: np.ndarray, pubs: np.ndarray, keys: np.ndarray, width: int
    ) -> np.ndarray:
        hit_pubs, entries = self.targets.hits(self.index, documents, publishers)
        restricted = np.zeros(len(documents), bool)
        restricted[hit_pubs] = True
        open_pubs = np.zeros(len(documents), bool)
        open_pubs[hit_pubs[self.targets.open_of[entries]]] = True
        members, _ = self.targets.keys(hit_pubs, entries, width)
        return ~restricted[pubs] | open_pubs[pubs] | np.isin(keys, members)


class Authorizer:
    """One registry version, compiled for batches."""

    def __init__(self, registry: Registry, with_authorization: bool) -> None:
        self.with_authorization = with_authorization
        self.visibility = Visibility(registry)
        # a user's rules in chunks: a pair stops being checked at the first chunk with a rule that
        # allows it, so thousands of rules cost a chunk's worth when the first ones allow
        self._rules: list[SubscriptionIndex] = []
        for user, rules in registry.rules.items():
            number = EVERYONE if user == ANYONE else user_number(user)
            for i, constraints in enumerate(rules):
                if i // RULE_CHUNK == len(self._rules):
                    self._rules.append(SubscriptionIndex())
                self._rules[i // RULE_CHUNK].add(f"{i}\x00{user}", constraints, number)
        # the admins' policies and the publishers' own, each a condition of its own
        self._policies = [
            compiled
            for compiled in (_Policies(registry, registry.policies), _Policies(registry, registry.publisher_policies))
            if len(compiled.index)
        ]
        self._crops = SubscriptionIndex()
        self._crop = _Targets()
        self._fields: list[tuple[str, ...]] = []
        for publisher, crops in registry.cropping.items():
            for rule in crops:
                named = set(rule.users).union(*(registry.members.get(g, frozenset()) for g in rule.groups))
                entry = self._crop.add(publisher, sorted(named))
                self._crops.add(str(entry), rule.data, entry)
                self._fields.append(rule.fields)
        self._crop.freeze()

    @property
    def passes_everything(self) -> bool:
        return not self.with_authorization and not self._policies and not len(self._crops)

    def _allowed(self, documents: Sequence[dict], pubs: np.ndarray, keys: np.ndarray, width: int) -> np.ndarray:
        """Which pairs some rule of the subscriber (or of anyone) allows."""
        allowed = np.zeros(len(pubs), bool)
        for index in self._rules:
            todo = np.flatnonzero(~allowed)
            if not len(todo):
                break
            wanted = np.flatnonzero(np.bincount(pubs[todo], minlength=len(documents)))  # (no sort)
            rule_pubs, slots = index.match_pairs([documents[i] for i in wanted.tolist()])
            rule_pubs, users = wanted[rule_pubs], index.numbers(slots)
            anyone = users == EVERYONE
            open_pubs = np.zeros(len(documents), bool)
            open_pubs[rule_pubs[anyone]] = True
            ok = open_pubs[pubs[todo]] | np.isin(keys[todo], rule_pubs[~anyone] * width + users[~anyone])
            allowed[todo[ok]] = True
        return allowed

    def filter(
        self,
        documents: Sequence[dict],
        bodies: Sequence[bytes],
        publishers: Sequence[str],
        pubs: np.ndarray,
        owners: np.ndarray,
        scopes: np.ndarray,
        admitted: np.ndarray,
    ) -> tuple[np.ndarray, list[tuple[int, bytes]]]:
        """Which (publication position, subscriber number) pairs may be delivered, and the cropped
        copies (pair position, bytes) some of them get instead of the publication. `scopes` and
        `admitted` are the pairs' subscriptions' scope numbers and admissions by attributes."""
        keep = np.ones(len(pubs), bool)
        if not len(pubs):
            return keep, []
        visible = self.visibility.visible(documents, pubs, owners, scopes, admitted)
        if visible is not None:
            keep = visible
        if self.passes_everything:
            return keep, []
        width = users_numbered() + 1
        keys = pubs * width + owners
        if self.with_authorization:
            keep &= self._allowed(documents, pubs, keys, width)
        publisher_numbers = np.array([user_number(p) for p in publishers], np.int64)
        for policies in self._policies:
            keep &= policies.allowed(documents, publisher_numbers, pubs, keys, width)
        copies: list[tuple[int, bytes]] = []
        if len(self._crops):
            hit_pubs, entries = self._crop.hits(self._crops, documents, publisher_numbers)
            named, named_entries = self._crop.keys(hit_pubs, entries, width)
            for pair in np.flatnonzero(keep & np.isin(keys, named)).tolist():
                fields = {f for entry in named_entries[named == keys[pair]].tolist() for f in self._fields[entry]}
                copies.append((pair, crop(bodies[int(pubs[pair])], sorted(fields))))
        return keep, copies
