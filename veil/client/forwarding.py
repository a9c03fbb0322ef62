"""Secret forwarding (seed 002, SPEC §7) over n independently operated Veil deployments.

The publisher seals the payload under a fresh key used for this one publication, splits the key
into n Shamir shares (any k reconstruct it, any k - 1 say nothing about it) and publishes to broker
i the routing attributes, the sealed payload, share i and the SHA-256 digests of all n shares (its
commitments to them), all under one forwarding id and the time; the digests, id and time are part
of what the seal authenticates (in RFC 8785 canonical JSON). With a signing key, the publisher signs
each copy, so that a subscriber who trusts its key (`trusted_keys`) knows every copy it takes is
the publisher's (`Forwarded.verified`) and a broker that alters one ends its own stream. A
subscriber subscribes on every broker, gathers the copies of each forwarding id, and opens the
payload with k shares that match a copy's digests, once the key they reconstruct authenticates that
copy. The digests are then the publisher's, and a share that does not match its digest is reported
as corrupted (Shamir alone could not tell: wrong shares can even combine to the right key). So up
to n - k brokers may be down, drop publications or alter what they forward, and fewer than k
colluding brokers learn nothing of the payload: with f brokers that may misbehave, k = f + 1 and
n >= 2f + 1 (k >= 2: with k = 1 every broker holds the key).

A subscriber gathers the copies of each (publisher, forwarding id): the brokers authenticate who
published, so a copy under another publisher's name never mixes with the publisher's own. It holds
at most MAX_PENDING unopened publications, and MAX_PENDING_BYTES of them, per broker and publisher:
a broker that floods it with invented forwarding ids, or a publisher that floods it through honest
brokers, evicts only its own copies, never another's share of a publication still to open. All of a
broker's copies together are bounded by BROKER_PUBLISHERS such budgets (its oldest go past them),
so that a broker inventing publishers' names holds no more; only that many publishers flooding at
once through an honest broker could evict an honest copy there. Once a
publication opens, only its shares are kept (to check late ones); opened ids are remembered (the
last MAX_DONE), so that a late or repeated copy neither opens a publication again nor starts a new
gathering. (Replays older than that are the publisher's signature and time to catch, not this.)

Seed 002 forwards shares over several hops of virtual nodes, re-splitting each share at every hop
(its Algorithm 2). Here the publisher reaches every broker directly and each broker delivers to the
subscriber directly: one hop, so there is nothing to re-split; the brokers' replicas are the n
deployments themselves.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from veil.client.client import DeliveryStream, VeilClient
from veil.client.errors import VeilError
from veil.protocol.canonical import canonical
from veil.protocol.reserved import FORWARD
from veil.security import shamir

NONCE = bytes(12)  # each payload key seals exactly one payload
MAX_PENDING = 10_000  # unopened forwarding ids a broker has copies in: beyond, its own oldest go
MAX_PENDING_BYTES = 64 << 20  # and their sealed payloads' bytes
BROKER_PUBLISHERS = 4  # a broker's copies of all publishers together: this many publishers' budgets
COPY_BYTES = 512  # what a copy holds besides its sealed payload, about
MAX_DONE = 100_000  # opened forwarding ids remembered
MAX_REPORTS = 10_000  # corrupted and mismatched copies remembered, the newest


class Forwarded(NamedTuple):
    id: str
    attributes: dict  # the routing attributes, as published
    payload: bytes
    brokers: tuple[int, ...]  # the brokers whose shares were the publisher's, by the time it opened
    corrupted: tuple[int, ...]  # those whose shares were not (later ones go to ForwardedStream.corrupted)
    publisher: str | None = None  # who published it, as the brokers authenticated it
    time: int = 0  # when, in milliseconds since the epoch, by the publisher's clock
    verified: bool = False  # the copy that opened carried the publisher's signature, verified by a trusted key


def _associated(attributes: dict, forward_id: str, k: int, n: int, digests: Sequence[str], at: int) -> bytes:
    """What the sealed payload is bound to: what every broker's copy has in common."""
    doc = {"attributes": attributes, "id": forward_id, "k": k, "n": n, "digests": list(digests), "time": at}
    return canonical(doc)


def check_thresholds(k: int, n: int | None = None) -> None:
    """ValueError unless k and n give what forwarding promises (see the module's docstring)."""
    if k < 2:
        raise ValueError(f"k is at least 2 (with k = {k} every broker holds the payload key); got k={k}")
    if n is not None and not 2 * k - 1 <= n <= shamir.MAX_SHARES:
        raise ValueError(
            f"n >= 2k - 1 = {2 * k - 1} brokers (k - 1 may misbehave, and k honest ones must remain) and at most "
            f"{shamir.MAX_SHARES}; got n={n}"
        )


def digest(share: shamir.Share) -> str:
    return base64.b64encode(hashlib.sha256(share.to_bytes()).digest()).decode()


def split_publication(attributes: dict, payload: bytes, k: int, n: int) -> list[dict]:
    """The n documents, one per broker."""
    if FORWARD in attributes:
        raise ValueError(f"{FORWARD} is where the forwarding fields go; the attributes cannot have it")
    check_thresholds(k, n)
    forward_id = uuid.uuid4().hex
    at = time.time_ns() // 1_000_000
    key = os.urandom(32)
    shares = shamir.split(key, k, n)
    digests = [digest(share) for share in shares]
    sealed = ChaCha20Poly1305(key).encrypt(NONCE, payload, _associated(attributes, forward_id, k, n, digests, at))
    sealed_text = base64.b64encode(sealed).decode()
    documents = []
    for share in shares:
        shared = base64.b64encode(share.to_bytes()).decode()
        fields = {"id": forward_id, "k": k, "n": n, "share": shared, "digests": digests, "sealed": sealed_text}
        fields["time"] = at
        documents.append({**attributes, FORWARD: fields})
    return documents


class ForwardingPublisher:
    """Publishes through n brokers (the clients, in broker order); a publication is accepted when at
    least k of them acknowledged it. With `signing_key` (key id, private key), every copy is signed."""

    def __init__(
        self, brokers: Sequence[VeilClient], k: int, signing_key: tuple[str, Ed25519PrivateKey] | None = None
    ) -> None:
        check_thresholds(k, len(brokers))
        self.brokers = list(brokers)
        self.k = k
        self.signing_key = signing_key

    async def publish(self, attributes: dict, payload: bytes) -> tuple[str, list[BaseException | None]]:
        """The forwarding id, and per broker None or why it did not take its share."""
        documents = split_publication(attributes, payload, self.k, len(self.brokers))
        results = await asyncio.gather(
            *(
                # (not retried: a broker that is down must not hold up the k that took their shares)
                broker.publish(doc, signing_key=self.signing_key, retry_for=0)
                for broker, doc in zip(self.brokers, documents, strict=True)
            ),
            return_exceptions=True,
        )
        failures = [r if isinstance(r, BaseException) else None for r in results]
        taken = sum(f is None for f in failures)
        if taken < self.k:
            problem = f"only {taken} of {len(self.brokers)} brokers took their share; {self.k} needed"
            raise VeilError("brokers", problem, 0)
        return documents[0][FORWARD]["id"], failures


class _Copy(NamedTuple):
    """What one broker forwarded besides its share: trusted only once it opens."""

    attributes: dict
    n: int
    digests: tuple[str, ...]
    sealed: bytes
    associated: bytes  # what the seal must authenticate, were this copy the publisher's
    time: int
    verified: bool  # it carried the publisher's signature, verified by a key the subscriber trusts


@dataclass
class _Gathering:
    shares: dict[int, shamir.Share] = field(default_factory=dict)  # broker -> its share
    copies: dict[int, _Copy] = field(default_factory=dict)  # broker -> the rest of its copy
    tried: set[tuple[bytes, bytes, tuple[int, ...]]] = field(default_factory=set)  # (a copy, brokers' shares)
    opened: _Copy | None = None  # the copy that opened: its digests are the publisher's


class _Pending:
    """Copies in unopened gatherings, oldest first, with their bytes, within `budgets` budgets."""

    def __init__(self, budgets: int = 1) -> None:
        self.ids: OrderedDict[tuple[str | None, str], int] = OrderedDict()  # (publisher, id) -> bytes
        self.bytes = 0
        self.budgets = budgets

    def add(self, key: tuple[str | None, str], size: int) -> None:
        self.ids[key] = size
        self.bytes += size

    def discard(self, key: tuple[str | None, str]) -> None:
        self.bytes -= self.ids.pop(key, 0)

    def over(self) -> bool:
        return len(self.ids) > self.budgets * MAX_PENDING or self.bytes > self.budgets * MAX_PENDING_BYTES


class ForwardedStream:
    """The forwarded publications of one subscription made on every broker, each once, opened."""

    def __init__(self, streams: Sequence[DeliveryStream | None], k: int) -> None:
        check_thresholds(k)
        self.streams = streams  # per broker; None for one that could not be subscribed on
        self.k = k
        # (forwarding id, broker) of the wrong shares seen, the newest MAX_REPORTS
        self.corrupted: deque[tuple[str, int]] = deque(maxlen=MAX_REPORTS)
        # (forwarding id, broker, its k) of copies made for another k than this subscriber's (the
        # publisher and the subscriber disagree, or the broker lies), the newest MAX_REPORTS
        self.mismatched: deque[tuple[str, int, int]] = deque(maxlen=MAX_REPORTS)
        self._gatherings: dict[tuple[str | None, str], _Gathering] = {}  # by (publisher, forwarding id)
        self._pending: dict[tuple[int, str | None], _Pending] = {}  # by (broker, publisher)
        self._by_broker: dict[int, _Pending] = {}  # all publishers' together
        self._done: OrderedDict[tuple[str | None, str], None] = OrderedDict()  # opened, oldest first
        self._out: asyncio.Queue[Forwarded] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ForwardedStream:
        for broker, stream in enumerate(self.streams):
            if stream is not None:
                self._tasks.append(asyncio.create_task(self._read(broker, stream)))
        return self

    async def __aexit__(self, *_: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for stream in self.streams:
            if stream is not None:
                await stream.aclose()

    def __aiter__(self) -> AsyncIterator[Forwarded]:
        return self

    async def __anext__(self) -> Forwarded:
        return await self._out.get()

    @property
    def dropped_duplicates(self) -> int:
        """Deliveries the brokers sent again, which their streams dropped."""
        return sum(stream.dropped_duplicates for stream in self.streams if stream is not None)

    async def _read(self, broker: int, stream: DeliveryStream) -> None:
        """One broker's deliveries; a broker that fails for good is one of the n - k tolerated."""
        with contextlib.suppress(VeilError, OSError):
            async for delivery in stream:
                self.take(broker, delivery.publication, delivery.publisher, delivery.verified)

    def take(self, broker: int, publication: object, publisher: str | None = None, verified: bool = False) -> None:
        """One broker's copy of a forwarded publication by `publisher` (anything else it delivers is
        ignored). Every copy keeps its own attributes and parameters until one opens, so a lying
        broker whose copy comes first cannot stand in for the others'."""
        if not isinstance(publication, dict) or not isinstance(publication.get(FORWARD), dict):
            return
        fields = publication[FORWARD]
        try:
            forward_id, k, n = str(fields["id"]), int(fields["k"]), int(fields["n"])
            share = shamir.Share.from_bytes(base64.b64decode(fields["share"]))
            attributes = {key: value for key, value in publication.items() if key != FORWARD}
            digests = tuple(str(d) for d in fields["digests"])
            sealed = base64.b64decode(fields["sealed"])
            at = int(fields["time"])
            associated = _associated(attributes, forward_id, k, n, digests, at)
        except (KeyError, TypeError, ValueError, RecursionError):
            return  # not a forwarded copy we can read: as if this broker had dropped it
        key = (publisher, forward_id)
        gathering = self._gatherings.get(key)
        if gathering is None and key in self._done:
            return  # opened, and its gathering let go: a late or repeated copy
        if k != self.k:
            self.mismatched.append((forward_id, broker, k))
            return
        if not k <= n <= shamir.MAX_SHARES:
            return  # not what this subscriber reconstructs with: as if dropped
        if gathering is None:
            gathering = self._gatherings[key] = _Gathering()
        if broker in gathering.shares:
            return
        gathering.shares[broker] = share
        if gathering.opened is not None:
            self._check(forward_id, gathering, broker)
        else:
            gathering.copies[broker] = _Copy(attributes, n, digests, sealed, associated, at, verified)
            self._try_open(key, gathering)
        if gathering.opened is None:
            # what the copy holds: its sealed payload, and its attributes, id and digests (`associated`)
            self._hold((broker, publisher), forward_id, len(sealed) + len(associated) + COPY_BYTES)
        elif len(gathering.shares) == gathering.opened.n:
            del self._gatherings[key]

    def _hold(self, holder: tuple[int, str | None], forward_id: str, size: int) -> None:
        """Count an unopened copy against its (broker, publisher)'s budget and its broker's; past
        either, the oldest copies it bounds go."""
        broker, publisher = holder
        own = self._pending.setdefault(holder, _Pending())
        everyone = self._by_broker.setdefault(broker, _Pending(BROKER_PUBLISHERS))
        own.add((publisher, forward_id), size)
        everyone.add((publisher, forward_id), size)
        for pending in (own, everyone):
            while pending.over():
                self._let_go(broker, next(iter(pending.ids)))

    def _let_go(self, broker: int, key: tuple[str | None, str]) -> None:
        """A broker's copy of an unopened publication is no longer held."""
        self._unhold(broker, key)
        gathering = self._gatherings[key]
        del gathering.shares[broker], gathering.copies[broker]
        if not gathering.shares:
            del self._gatherings[key]

    def _unhold(self, broker: int, key: tuple[str | None, str]) -> None:
        own = self._pending.get((broker, key[0]))
        if own is not None:
            own.discard(key)
            if not own.ids:
                del self._pending[(broker, key[0])]
        everyone = self._by_broker.get(broker)
        if everyone is not None:
            everyone.discard(key)

    def _opened(self, key: tuple[str | None, str], gathering: _Gathering) -> None:
        """Its copies no longer count against budgets, nor are kept (only the shares are, to check
        late ones against the publisher's digests); its id is remembered."""
        for broker in gathering.shares:
            self._unhold(broker, key)
        gathering.copies.clear()
        self._done[key] = None
        while len(self._done) > MAX_DONE:
            self._gatherings.pop(self._done.popitem(last=False)[0], None)

    def _check(self, forward_id: str, gathering: _Gathering, broker: int) -> bool:
        """Whether a broker's share is the one the publisher committed to (reported if not)."""
        assert gathering.opened is not None
        digests, share = gathering.opened.digests, gathering.shares[broker]
        if 1 <= share.index <= len(digests) and digest(share) == digests[share.index - 1]:
            return True
        self.corrupted.append((forward_id, broker))
        return False

    def _try_open(self, which: tuple[str | None, str], gathering: _Gathering) -> None:
        """For each distinct copy, k shares (of distinct indexes) that match its digests, until the key
        they make opens it: a wrong share is never combined, so one try per copy and set of shares."""
        publisher, forward_id = which
        brokers = sorted(gathering.shares)
        distinct: dict[tuple[bytes, bytes], _Copy] = {}
        for copy in gathering.copies.values():  # of identical copies, a signed one (an unsigned one proves less)
            seen = distinct.setdefault((copy.sealed, copy.associated), copy)
            if copy.verified and not seen.verified:
                distinct[(copy.sealed, copy.associated)] = copy
        for copy in distinct.values():
            chosen: dict[int, int] = {}  # share index -> broker
            for broker in brokers:
                share = gathering.shares[broker]
                if 1 <= share.index <= len(copy.digests) and digest(share) == copy.digests[share.index - 1]:
                    chosen.setdefault(share.index, broker)
            subset = tuple(sorted(chosen.values())[: self.k])
            tried = (copy.sealed, copy.associated, subset)  # a liar's copy differs from the publisher's somewhere
            if len(subset) < self.k or tried in gathering.tried:
                continue
            gathering.tried.add(tried)
            try:
                secret = shamir.combine([gathering.shares[b] for b in subset])
                payload = ChaCha20Poly1305(secret).decrypt(NONCE, copy.sealed, copy.associated)
            except (ValueError, InvalidTag):
                continue
            gathering.opened = copy._replace(attributes={}, sealed=b"", associated=b"")  # its digests
            self._opened(which, gathering)
            honest = tuple(b for b in brokers if self._check(forward_id, gathering, b))
            corrupted = tuple(b for b in brokers if b not in honest)
            self._out.put_nowait(
                Forwarded(forward_id, copy.attributes, payload, honest, corrupted, publisher, copy.time, copy.verified)
            )
            return


async def subscribe_forwarded(
    brokers: Sequence[VeilClient], data: list[dict], k: int, subscription_id: str | None = None
) -> ForwardedStream:
    """Subscribe with the same filter on every broker (the same id on each) and gather what they
    forward. Brokers that cannot be reached now are skipped, up to n - k of them."""
    check_thresholds(k, len(brokers))
    subscription_id = subscription_id or uuid.uuid4().hex
    results = await asyncio.gather(
        *(broker.subscribe(data, subscription_id) for broker in brokers), return_exceptions=True
    )
    reached = [not isinstance(r, BaseException) for r in results]
    if sum(reached) < k:
        problem = f"only {sum(reached)} of {len(brokers)} brokers took the subscription; {k} needed"
        raise VeilError("brokers", problem, 0)
    streams = [broker.deliveries(subscription_id) if ok else None for broker, ok in zip(brokers, reached, strict=True)]
    return ForwardedStream(streams, k)
