"""Webhook subscriptions: delivered by POSTs to the endpoint their subscriber named instead of over
a connection, served by the gateway like a connection of one subscription nobody opened.

Each gateway looks every SCAN seconds (and at once after a webhook subscription is made through
it) for webhook subscriptions that no live gateway delivers, and claims them as a connection would
(`membership`): one gateway delivers each, and when that one goes silent another takes over from
the saved cursor. The deliveries are a `Bundle` of one with envelopes and without client
acknowledgements: its lines go out in queue order, `batch` to a request, one request at a time, and
a request the endpoint answers with a 2xx is what moves the cursor. A request that fails (no answer
within --webhook-timeout, a refused connection, any other status) is made again after a backoff
that doubles from --webhook-backoff, up to --webhook-attempts in all; then its deliveries go to the
subscription's dead letters (reason "attempts"), where its owner reads, replays or purges them as
any others, and the next ones follow. While an endpoint keeps failing (a request of it was
dead-lettered and none has been taken since), each later request gets one attempt: a dead endpoint
costs its queue a request's time per batch, not the whole retry schedule.

Deliveries are at least once: a request the endpoint took whose answer was lost, or that was taken
just before this gateway stopped without saving the cursor, is made again. Each delivery's `seq`
(its publication's id, as in every envelope) tells a receiver what it has seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

import orjson

from veil.gateway.context import Gateway
from veil.gateway.delivering import serve_subscriptions
from veil.gateway.membership import STALE
from veil.gateway.webhook_requests import MOST_RETRY_AFTER, Poster, shown
from veil.gateway.webhook_runs import Running
from veil.protocol import Handshake
from veil.security.identity import Principal
from veil.security.webhook_signature import HEADER, sign
from veil.store import WebhookSubscription

log = logging.getLogger("veil.gateway")
SCAN = 2.0  # seconds between looks for webhook subscriptions no gateway delivers
SCAN_LIMIT = 1000  # taken up at one look
MOST_BACKOFF = 300.0  # seconds between two attempts at most
UNRENEWED_WAIT = 0.5  # seconds between looks at this gateway's renewals while they fail


async def supervise(gateway: Gateway) -> None:
    webhooks = gateway.webhooks
    poster = Poster(gateway.config, webhooks.names())
    try:
        while True:
            try:
                await _look(gateway, poster)
            except gateway.threads.store.failures as exc:
                log.warning("looking for webhook subscriptions to deliver failed (%s); again in %g s", exc, SCAN)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(webhooks.wake.wait(), SCAN)
            webhooks.wake.clear()
    finally:
        running = list(webhooks.running.values())
        for run in running:
            run.ended.set()
        await asyncio.gather(*(run.task for run in running if run.task is not None), return_exceptions=True)
        await poster.close()
        await webhooks.close_names()


async def _look(gateway: Gateway, poster: Poster) -> None:
    """End the deliveries of subscriptions replaced, removed or quarantined (through any gateway) or
    delivered by another gateway now (this one's claim lapsed while it could not renew it), and
    start those of webhook subscriptions nobody delivers, a page a look."""
    threads, webhooks = gateway.threads, gateway.webhooks
    running, name, alive_since = webhooks.running, gateway.config.gateway_name, time.time() - STALE
    numbers = [run.number for run in running.values()]
    versions = await threads.read(threads.store.webhook_versions, numbers, alive_since)
    for run in running.values():
        version, holder = versions.get(run.number, (None, None))
        if version != run.version or holder not in (None, name):
            run.ended.set()
    found = await threads.read(threads.store.unclaimed_webhooks, alive_since, webhooks.after, SCAN_LIMIT)
    webhooks.after = found[-1].number if len(found) == SCAN_LIMIT else 0
    for subscription in found:
        if subscription.sub_id not in running:  # (one still ending starts at a later look)
            run = running[subscription.sub_id] = Running(subscription.number, subscription.version)
            run.task = asyncio.create_task(_deliver(gateway, poster, subscription, run))


async def _deliver(gateway: Gateway, poster: Poster, subscription: WebhookSubscription, run: Running) -> None:
    """Deliver one webhook subscription until it ends here: replaced, removed, quarantined, claimed by
    another gateway, or this one stopping."""
    endpoint = Endpoint(gateway, poster, subscription)
    handshake = Handshake(None, subscription.sub_id, envelope=True, ack=False, resume_after=None)
    # its owner's place: its queued lines count against the owner's quota, as a connection's would (it is
    # not one of the owner's connections, which --max-client-connections counts)
    client = gateway.hub.quotas.connect(subscription.owner, webhook=True)

    async def close(error: bytes | None) -> None:
        if error is not None:
            log.info("webhook subscription %s not delivered here: %s", subscription.sub_id, error.decode()[:300])
        run.ended.set()

    async def receive() -> bytes | str | None:
        await run.ended.wait()
        return None

    try:
        await serve_subscriptions(
            gateway, handshake, Principal(subscription.owner), client, endpoint.send, close, receive, webhook=True
        )
    except Exception:
        log.exception("delivering webhook subscription %s failed; taken up again", subscription.sub_id)
    finally:
        gateway.hub.quotas.disconnect_webhook(client)
        gateway.webhooks.running.pop(subscription.sub_id, None)


class Endpoint:
    """One subscription's endpoint: its deliveries POSTed in order, retried, dead-lettered."""

    def __init__(self, gateway: Gateway, poster: Poster, subscription: WebhookSubscription) -> None:
        self.gateway = gateway
        self.poster = poster
        self.subscription = subscription
        self.failing = False  # a request was dead-lettered, and none taken since
        self.warned = False  # (said so in the log, once a streak)
        self._id = orjson.dumps(subscription.sub_id)

    async def send(self, lines: list[bytes]) -> None:
        """Deliver these enveloped lines, `batch` to a request; returns once each request was taken or
        dead-lettered. The deliveries of requests taken count consumed as soon as they are, up to the
        first one dead-lettered; those dead-lettered go to the store in one write at the end, with
        the cursor past all of them (a dead endpoint costs a write per `send`, not per request)."""
        batch, number = self.subscription.webhook.batch, self.subscription.number
        unsent: list[int] = []
        for start in range(0, len(lines), batch):
            chunk = lines[start : start + batch]
            seqs = [_seq(line) for line in chunk]
            if not await self._post(chunk):
                unsent += seqs
                self.failing = True
            elif not unsent:
                self.gateway.hub.save_cursor(number, seqs[-1])
        if unsent:
            await self._dead_letter(unsent, _seq(lines[-1]))

    async def _post(self, chunk: list[bytes]) -> bool:
        """Whether the endpoint took the request, in the attempts it has."""
        subscription, config = self.subscription, self.gateway.config
        body = b'{"subscriptionId":%s,"deliveries":[%s]}' % (self._id, b",".join(chunk))
        attempts = 1 if self.failing else config.webhook_attempts
        for attempt in range(1, attempts + 1):
            await self._while_unrenewed()
            headers = {"Content-Type": "application/json", HEADER: sign(subscription.webhook.secret, body)}
            outcome = await self.poster.post(subscription.owner, subscription.webhook.url, body, headers)
            if outcome.problem is None:
                if self.failing:
                    log.info("webhook subscription %s: its endpoint takes requests again", subscription.sub_id)
                self.failing = self.warned = False
                return True
            log.log(
                logging.DEBUG if self.warned else logging.INFO,  # (a dead endpoint's every request: said once)
                "webhook subscription %s: request %d of %d to %s failed: %s", subscription.sub_id, attempt, attempts,
                shown(subscription.webhook.url), outcome.problem,
            )  # fmt: skip
            if attempt < attempts:
                await asyncio.sleep(_backoff(config.webhook_backoff, attempt, outcome.retry_after))
        return False

    async def _while_unrenewed(self) -> None:
        """Wait while this gateway has not renewed its row for half of STALE: cut off from the store,
        its claim may lapse and another gateway take the subscription over, and the two would POST
        the same deliveries (neither attempts nor backoff count meanwhile)."""
        claims = self.gateway.claims
        if time.monotonic() - claims.renewed > STALE / 2:
            sub_id = self.subscription.sub_id
            log.warning("webhook subscription %s: this gateway cannot renew its claims; waiting", sub_id)
            while time.monotonic() - claims.renewed > STALE / 2:
                await asyncio.sleep(UNRENEWED_WAIT)

    async def _dead_letter(self, seqs: list[int], through: int) -> None:
        subscription = self.subscription
        threads = self.gateway.threads
        now = time.time_ns() // 1_000_000
        await threads.write(threads.store.dead_letter_unsent, subscription.number, seqs, through, now)
        self.gateway.hub.save_cursor(subscription.number, through)
        if not self.warned:
            self.warned = True
            log.warning(
                "webhook subscription %s: %d deliveries dead-lettered after %d attempts at %s; later ones get one "
                "attempt each until one is taken", subscription.sub_id, len(seqs), self.gateway.config.webhook_attempts,
                shown(subscription.webhook.url),
            )  # fmt: skip


def _seq(line: bytes) -> int:
    """An enveloped line's seq (`envelope.wrap` writes it first)."""
    return int(line[7 : line.index(b",", 7)])


def _backoff(first: float, attempt: int, retry_after: float | None) -> float:
    """Seconds before the attempt after `attempt`: doubling, with jitter so that the endpoints of
    many subscriptions that failed together are not all retried together."""
    delay = min(MOST_BACKOFF, first * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
    return max(delay, min(retry_after or 0.0, MOST_RETRY_AFTER))
