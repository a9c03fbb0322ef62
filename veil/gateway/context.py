"""The parts of the gateway that request and connection handlers use, in one typed object that the
server puts in each application (`GATEWAY`): handlers read what they need from it and nothing else."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from aiohttp import web

from veil.config import Config
from veil.gateway.channel import EdgeChannels
from veil.gateway.claims import Claims
from veil.gateway.credential_watch import CredentialWatch
from veil.gateway.delivery import DeliveryHub
from veil.gateway.health import Health
from veil.gateway.ingest import Ingest
from veil.gateway.registry import CurrentRegistry
from veil.gateway.store_threads import StoreThreads
from veil.gateway.unproven import Unproven
from veil.gateway.webhook_runs import Webhooks
from veil.monitoring.metrics import Metrics
from veil.protocol.limits import Limits
from veil.security.identity import Authenticator


@dataclass(frozen=True)
class Gateway:
    config: Config
    limits: Limits
    threads: StoreThreads  # the store, from the event loop
    ingest: Ingest  # appends publications, group-committed
    hub: DeliveryHub  # connected subscriptions and their queues
    auth: Authenticator
    registry: CurrentRegistry
    unproven: Unproven  # connections that have yet to send anything
    parsing: ThreadPoolExecutor  # large bodies are parsed here, off the event loop
    edges: EdgeChannels
    credentials: CredentialWatch  # open delivery connections, ended when their credentials are revoked
    health: Health
    metrics: Metrics
    metrics_hash: str | None  # the SELIS monitoring client's authHash (None: monitoring off)
    webhooks: Webhooks = field(default_factory=Webhooks)  # webhook subscriptions this gateway delivers
    claims: Claims = field(default_factory=Claims)  # subscriptions claimed, gathered (`membership`)
    # claims whose release failed (the store unreachable), retried with the renewals (`membership`)
    unreleased: list[tuple[list[str], float]] = field(default_factory=list)
    # this process among those that ever held the gateway's name (`membership`)
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex)
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set: the gateway stops (a signal, or...)
    replaced: asyncio.Event = field(default_factory=asyncio.Event)  # ...another process took its name over


GATEWAY = web.AppKey("gateway", Gateway)
