"""One MQTT 5 connection for a bridge, through paho-mqtt (Eclipse's client; asyncio wrappers such as
aiomqtt hide the DUP flag and the manual acknowledgement the bridge needs), its network thread
handing messages and acknowledgements to the event loop.

The session is persistent (a fixed client id, clean start off, a session that never expires): what
arrives for the bridge while it is down waits at the MQTT broker, and a message it received but did
not acknowledge comes again, marked DUP, when it reconnects. The bridge subscribes with "retain
handling 1": a retained message comes once, when its subscription is new, not again on every
reconnect. Acknowledgements are manual: a QoS 1 message is acknowledged only when `ack` is called.

Each message carries the number of the connection it came on (`connection`), counted on paho's
thread, which bumps it as soon as a connection is lost, before it opens the next: an
acknowledgement of an older connection's message is never sent on a newer one, where its packet id
may name another message. After a reconnect that resumed the session, such a message comes again;
after one that found no session (the MQTT broker lost it), it will not (`resumed`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from veil.bridge.topics import shown

log = logging.getLogger("veil.bridge")

KEEPALIVE = 30  # seconds
NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval: the session outlives any downtime
RECEIVE_MAXIMUM = 256  # QoS 1 messages the MQTT broker sends before it waits for acknowledgements
MAXIMUM_PACKET = (1 << 20) + (1 << 16) + 256  # bytes: a payload of 1 MiB under a topic of 64 KiB; larger ones
# the MQTT broker does not send (MQTT 5 Maximum Packet Size), so they never take the bridge's memory
QUOTA_EXCEEDED = 0x97
QOS0_BYTES = 64 << 20  # QoS 0 messages waiting beyond this many bytes are dropped (at most once anyway)


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    mid: int
    qos: int
    dup: bool
    connection: int


def redacted(url: str) -> str:
    """The URL without its user and password (everything between `://` and the last `@`, however
    the password is spelled), for messages and logs."""
    return re.sub(r"://.*@", "://…@", url)


class PublishRefused(Exception):
    """The MQTT broker acknowledged a publish with a failure reason (not authorized, quota exceeded)."""

    def __init__(self, reason: str, retry: bool) -> None:
        super().__init__(reason)
        self.retry = retry  # the reason is for now (quota exceeded), not for this message


def broker_address(url: str) -> tuple[str, int, bool, str | None, str | None]:
    """(host, port, tls, username, password) of `mqtt://[user:password@]host[:1883]` or `mqtts://...:8883`."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise ValueError(f"--mqtt {redacted(url)!r}: write mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")
    tls = parts.scheme == "mqtts"
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError:
        raise ValueError(f"--mqtt {redacted(url)!r}: the port is not a number from 1 to 65535") from None
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return parts.hostname, port, tls, user, password


class MqttLink:
    def __init__(
        self,
        url: str,
        client_id: str,
        filters: list[str],
        *,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        self.host, self.port, tls, user, password = broker_address(url)
        self.filters = filters
        self.messages: asyncio.Queue[Received] = asyncio.Queue()
        self.connected = asyncio.Event()
        self.dropped_qos0 = 0
        self._qos0_bytes = 0
        self._loop = asyncio.get_running_loop()
        self._published: dict[int, asyncio.Future[None]] = {}
        self._lock = threading.Lock()  # the connection count, read on the loop and changed on paho's thread
        self._connection = 0
        self._resumed: dict[int, bool] = {}  # connection -> whether it resumed the session
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5, manual_ack=True
        )
        if user is not None:
            self._client.username_pw_set(user, password)
        if tls:
            self._client.tls_set(
                ca_certs=ca_file, certfile=cert_file, keyfile=key_file, tls_version=ssl.PROTOCOL_TLS_CLIENT
            )
        self._client.reconnect_delay_set(1, 8)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_publish = self._on_publish
        self._client.on_subscribe = self._on_subscribe

    async def __aenter__(self) -> MqttLink:
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = NEVER_EXPIRES
        properties.ReceiveMaximum = RECEIVE_MAXIMUM
        properties.MaximumPacketSize = MAXIMUM_PACKET
        self._client.connect_async(self.host, self.port, KEEPALIVE, clean_start=False, properties=properties)
        self._client.loop_start()
        return self

    async def __aexit__(self, *_: object) -> None:
        self._client.disconnect()
        await asyncio.to_thread(self._client.loop_stop)

    @property
    def connection(self) -> int:
        with self._lock:
            return self._connection

    def resumed(self, connection: int) -> bool:
        """Whether that connection found the session of the one before (so what came on that one and
        was not acknowledged comes again)."""
        with self._lock:
            return self._resumed.get(connection, False)

    def taken(self, messages: list[Received]) -> None:
        """These were taken from `messages`: the QoS 0 ones no longer count against its bound."""
        self._qos0_bytes -= sum(len(m.payload) for m in messages if m.qos == 0)

    def ack(self, message: Received) -> bool:
        """Acknowledge a QoS 1 message, if the connection it came on is still the one open; whether
        it was (a QoS 0 message needs none)."""
        if message.qos == 0:
            return True
        with self._lock:  # paho's thread changes the count only under it: no new connection meanwhile
            if message.connection != self._connection:
                return False
            self._client.ack(message.mid, message.qos)
            return True

    async def publish(self, topic: str, payload: bytes) -> None:
        """Publish at QoS 1 and return once the MQTT broker acknowledged it (a publish cut off by a
        reconnect is sent again by paho, under the persistent session); PublishRefused if the
        acknowledgement gives a failure reason."""
        await self.connected.wait()
        info = self._client.publish(topic, payload, qos=1)
        if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
            raise ConnectionError(f"MQTT publish to {shown(topic)}: {mqtt.error_string(info.rc)}")
        done = self._loop.create_future()
        # registered before the next await: the acknowledgement's callback runs on this loop, after it
        self._published[info.mid] = done
        await done

    # paho's network thread calls these; each hands over to the event loop

    def _on_connect(self, client: mqtt.Client, _: Any, flags: Any, reason: Any, __: Any) -> None:
        if reason.is_failure:
            log.error("MQTT broker %s:%d refused the connection: %s", self.host, self.port, reason)
            return
        with self._lock:
            self._resumed[self._connection] = bool(flags.session_present)
        if self.filters:  # again on every connection (the session may be new); retained ones only if new
            options = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
            client.subscribe([(f, options) for f in self.filters])
        self._loop.call_soon_threadsafe(self._opened, bool(flags.session_present))

    def _on_disconnect(self, _: mqtt.Client, __: Any, ___: Any, reason: Any, ____: Any) -> None:
        with self._lock:
            self._connection += 1
        self._loop.call_soon_threadsafe(self.connected.clear)
        if reason.is_failure:
            log.warning("MQTT connection to %s:%d lost (%s); reconnecting", self.host, self.port, reason)

    def _on_message(self, _: mqtt.Client, __: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            connection = self._connection
        received = Received(message.topic, bytes(message.payload), message.mid, message.qos, message.dup, connection)
        self._loop.call_soon_threadsafe(self._arrived, received)

    def _on_subscribe(self, _: mqtt.Client, __: Any, ___: int, reasons: list[Any], ____: Any) -> None:
        refused = [f for f, reason in zip(self.filters, reasons, strict=False) if reason.is_failure]
        if refused:
            log.error("MQTT broker refused the subscriptions to %s", ", ".join(refused))
        else:
            log.info("MQTT subscribed to %s", ", ".join(self.filters))

    def _on_publish(self, _: mqtt.Client, __: Any, mid: int, reason: Any, ____: Any) -> None:
        refused = PublishRefused(str(reason), reason.value == QUOTA_EXCEEDED) if reason.is_failure else None
        self._loop.call_soon_threadsafe(self._acknowledged, mid, refused)

    # on the event loop

    def _opened(self, session_present: bool) -> None:
        self.connected.set()
        log.info(
            "MQTT connected to %s:%d (%s)",
            self.host,
            self.port,
            "session resumed" if session_present else "new session",
        )

    def _arrived(self, message: Received) -> None:
        if message.qos == 0:
            if self._qos0_bytes + len(message.payload) > QOS0_BYTES:
                self.dropped_qos0 += 1
                if self.dropped_qos0 % 1000 == 1:
                    log.warning("QoS 0 messages dropped: %d (more than %d bytes of them waiting)", self.dropped_qos0,
                                QOS0_BYTES)  # fmt: skip
                return
            self._qos0_bytes += len(message.payload)
        self.messages.put_nowait(message)

    def _acknowledged(self, mid: int, refused: PublishRefused | None) -> None:
        done = self._published.pop(mid, None)
        if done is not None and not done.done():
            if refused is None:
                done.set_result(None)
            else:
                done.set_exception(refused)
