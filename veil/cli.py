"""The `veil` command line: serve, publish, unpublish, edge, bridge mqtt, subscribe, subscriptions,
unsubscribe, scope rotate, keygen, token and certs."""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson

from veil import config as config_module

EXPRESSION = re.compile(r"^\s*([^<>=!~]+?)\s*(>=|<=|!=|==|=|>|<|~)\s*(.*?)\s*$")
EXPRESSION_OPS = {">=": "ge", "<=": "le", "!=": "ne", "==": "eq", "=": "eq", ">": "gt", "<": "lt", "~": "contains"}


DEFAULT_URL = "http://127.0.0.1:20000"
DEFAULT_MQTT = "mqtt://127.0.0.1:1883"


def _client_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"the broker's REST base URL (default: {DEFAULT_URL}; environment VEIL_URL)")
    parser.add_argument("--auth-hash", help="your authHash, a static hash (default: none; environment VEIL_AUTH_HASH)")
    parser.add_argument(
        "--token", help="bearer token of your identity provider (default: none; environment VEIL_TOKEN)"
    )
    parser.add_argument("--ca", help="CA file to verify the broker's certificate (https) (default: none)")
    parser.add_argument("--cert", help="client certificate, for mutual TLS (default: none)")
    parser.add_argument("--key", help="private key of the client certificate (default: none)")
    parser.add_argument(
        "--recipient-key",
        help="your recipient private key (PEM, from `veil keygen`): seals and opens scope payloads (default: "
        "none; environment VEIL_RECIPIENT_KEY)",
    )
    parser.add_argument(
        "--scope-managers",
        help="JSON file: scope -> key id -> base64 Ed25519 public key of a manager whose signed key rosters "
        "you believe; no scope key is used without one (default: none; environment VEIL_SCOPE_MANAGERS)",
    )


def _given(args: argparse.Namespace, name: str, env: str) -> str | None:
    """A client option: the flag, else its environment variable (read at use, so help shows no
    one's setting as the default)."""
    value = getattr(args, name)
    return value if value is not None else os.environ.get(env) or None


def _client(args: argparse.Namespace):
    from veil.client import VeilClient

    return VeilClient(
        _given(args, "url", "VEIL_URL") or DEFAULT_URL, auth_hash=_given(args, "auth_hash", "VEIL_AUTH_HASH"),
        token=_given(args, "token", "VEIL_TOKEN"), ca_file=args.ca, cert_file=args.cert, key_file=args.key,
        recipient_key=_recipient_key(_given(args, "recipient_key", "VEIL_RECIPIENT_KEY")),
        scope_managers=_json_file(_given(args, "scope_managers", "VEIL_SCOPE_MANAGERS"), "--scope-managers"),
        tcp_port=getattr(args, "tcp_port", None), ws_port=getattr(args, "ws_port", None),
    )  # fmt: skip


def _pem_keys(path: str, option: str) -> list[Any]:
    """The private keys of a PEM file, in order (a hybrid recipient key is two)."""
    from cryptography.hazmat.primitives import serialization

    end = b"-----END PRIVATE KEY-----"
    try:
        with open(path, "rb") as handle:
            blocks = [block + end for block in handle.read().split(end) if block.strip()]
        return [serialization.load_pem_private_key(block, None) for block in blocks]
    except (OSError, ValueError, TypeError) as exc:
        raise SystemExit(f"veil: {option} {path}: {exc}") from None


def _recipient_key(path: str | None):
    if path is None:
        return None
    from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from veil.security.sealing import HybridKey

    keys = _pem_keys(path, "--recipient-key")
    if len(keys) == 1 and isinstance(keys[0], X25519PrivateKey):
        return keys[0]
    if len(keys) == 2 and isinstance(keys[0], MLKEM768PrivateKey) and isinstance(keys[1], X25519PrivateKey):
        return HybridKey(keys[0], keys[1])
    raise SystemExit(f"veil: --recipient-key {path}: neither an X25519 key nor an ML-KEM-768 and an X25519 key")


def _signing_key(path: str, key_id: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    keys = _pem_keys(path, "--signing-key")
    if len(keys) != 1 or not isinstance(keys[0], Ed25519PrivateKey):
        raise SystemExit(f"veil: --signing-key {path}: not an Ed25519 private key")
    return key_id, keys[0]


def _json_file(path: str | None, option: str) -> Any:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return orjson.loads(handle.read())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise SystemExit(f"veil: {option} {path}: {exc}") from None


def parse_constraint(text: str) -> dict[str, Any]:
    """`lat>14`, `name=MED FRIGO`, or a JSON constraint object."""
    if text.lstrip().startswith("{"):
        return orjson.loads(text)
    found = EXPRESSION.match(text)
    if not found:
        raise ValueError(f"constraint {text!r}: write KEY OP VALUE with OP one of {', '.join(EXPRESSION_OPS)}")
    key, op, raw = found.groups()
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = raw
    return {"key": key, "op": EXPRESSION_OPS[op], "val": value}


def parse_score_term(text: str) -> dict[str, Any]:
    """`NO2:high`, `temp:low` or `lat=45.8`, optionally weighted: `NO2:high*2`."""
    term, _, weight = text.partition("*")
    key, sep, rest = term.partition(":") if ":" in term else term.partition("=")
    if not key or not rest:
        raise ValueError(f"--score {text!r}: use KEY:high, KEY:low or KEY=TARGET, optionally *WEIGHT")
    try:
        doc: dict[str, Any] = {"key": key, "prefer": rest} if sep == ":" else {"key": key, "target": float(rest)}
        if weight:
            doc["weight"] = float(weight)
    except ValueError:
        raise ValueError(f"--score {text!r}: the target and the weight are numbers") from None
    return doc


async def _publish(args: argparse.Namespace) -> int:
    if args.seal is None and (args.payload is not None or args.payload_file is not None):
        raise SystemExit("veil publish: --payload and --payload-file go with --seal SCOPE")
    if args.seal is not None and _given(args, "recipient_key", "VEIL_RECIPIENT_KEY") is None:
        raise SystemExit("veil publish: --seal needs --recipient-key (your recipient private key)")
    payload = args.payload.encode() if args.payload is not None else None
    if args.payload_file == "-":
        if not args.publication:
            raise SystemExit("veil publish: --payload-file - reads the payload from stdin: give the publication too")
        payload = sys.stdin.buffer.read()
    elif args.payload_file is not None:
        try:
            with open(args.payload_file, "rb") as handle:
                payload = handle.read()
        except OSError as exc:
            raise SystemExit(f"veil publish: --payload-file {args.payload_file}: {exc.strerror}") from None
    async with _client(args) as client:
        documents = args.publication or [line for line in sys.stdin if line.strip()]
        for number, document in enumerate(documents, start=1):
            key = args.idempotency_key
            if key is not None and len(documents) > 1:
                key = f"{key}#{number}"
            if args.seal is None:
                print(await client.publish(document.encode(), valid_for=args.valid_for, idempotency_key=key))
                continue
            attributes = orjson.loads(document)
            if not isinstance(attributes, dict):
                raise SystemExit("veil publish: with --seal, a publication is a JSON object of routing attributes")
            sealed = await client.publish(
                attributes, valid_for=args.valid_for, seal=args.seal, payload=payload, idempotency_key=key
            )
            print(sealed)
    return 0


async def _edge(args: argparse.Namespace) -> int:
    """Publications from stdin (one JSON document per line) published only while wanted."""
    from veil.client import EdgeBroker

    told: list[bool] = []

    def tell(wanted: bool) -> None:
        told.append(wanted)
        print(f"wanted: {str(wanted).lower()}", file=sys.stderr, flush=True)

    announcement = [parse_constraint(c) for c in args.constraint]
    async with (
        _client(args) as client,
        EdgeBroker(client, announcement, announcement_id=args.id, on_wanted=tell) as edge,
    ):
        async with asyncio.timeout(60):  # not wait_for, which may swallow a stop arriving as it completes
            await edge.synced.wait()
        if not told:  # on_wanted reports changes only: a start that nothing wants is said here
            tell(False)
        async for line in _stdin_lines():
            if line.strip():
                sent = await edge.publish(orjson.loads(line))
                print(sent if sent is not None else "withheld", flush=True)
    return 0


async def _bridge_mqtt(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    from veil.bridge.mqtt_bridge import MqttBridge
    from veil.bridge.mqtt_link import broker_address
    from veil.bridge.topics import TopicTemplate

    topics, deliver = [], []
    for text in args.topic:
        try:
            topics.append(TopicTemplate.parse(text))
        except ValueError as exc:
            raise ValueError(f"--topic: {exc}") from None
    for pair in args.deliver:
        subscription, sep, topic = pair.partition("=")
        try:
            if not sep or not subscription:
                raise ValueError(f"{pair!r}: write SUBSCRIPTION_ID=TOPIC")
            deliver.append((subscription, TopicTemplate.parse(topic).check_outbound()))
        except ValueError as exc:
            raise ValueError(f"--deliver: {exc}") from None
    mqtt_url = _given(args, "mqtt", "VEIL_MQTT") or DEFAULT_MQTT
    host, port, *_ = broker_address(mqtt_url)
    journal = args.journal or f"veil-bridge-{quote(host, safe='')}-{port}-{quote(args.client_id, safe='')}.journal"
    if not topics and not deliver:
        raise ValueError("give --topic (MQTT into Veil), --deliver (Veil out to MQTT), or both")
    credential = _given(args, "auth_hash", "VEIL_AUTH_HASH") or _given(args, "token", "VEIL_TOKEN") or args.cert
    if topics and credential is None:
        raise ValueError(
            "--topic needs a credential (--auth-hash, --token or --cert): Veil remembers a publisher's "
            "idempotency keys per identity, and without them a message MQTT sends again is published twice"
        )
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    async with _client(args) as client:
        await MqttBridge(
            client, mqtt_url, args.client_id,
            journal, topics, deliver, args.value_attribute,
            (args.mqtt_ca, args.mqtt_cert, args.mqtt_key),
        ).run()  # fmt: skip
    return 0


async def _stdin_lines() -> AsyncIterator[str]:
    """Standard input's lines, read on a daemon thread: a thread of the loop's executor blocked in a
    read would keep the process alive after a stop until the next line came. A read that fails
    (bytes that are not text, a closed stream) is raised here."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | Exception] = asyncio.Queue(maxsize=64)

    def hand(item: str | Exception) -> bool:
        try:
            asyncio.run_coroutine_threadsafe(lines.put(item), loop).result()
            return True
        except (RuntimeError, concurrent.futures.CancelledError):  # the loop stopped: nobody reads any more
            return False

    def read() -> None:
        end: str | Exception = ""
        try:
            for line in iter(sys.stdin.readline, ""):
                if not hand(line):
                    return
        except (OSError, ValueError) as exc:
            end = exc
        hand(end)

    threading.Thread(target=read, name="stdin", daemon=True).start()
    while item := await lines.get():
        if isinstance(item, Exception):
            raise ValueError(f"standard input: {item}")
        yield item


async def _unpublish(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        await client.unpublish(args.id)
    return 0


AGO = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}  # ms per unit of a --since time ago


def _since(text: str) -> int:
    """--since as milliseconds since the epoch."""
    from veil.protocol import ProtocolError
    from veil.protocol.subscriptions import parse_since

    if text[:-1].isdigit() and text[-1:] in AGO:
        return time.time_ns() // 1_000_000 - int(text[:-1]) * AGO[text[-1]]
    try:
        return parse_since(int(text) if text.isdigit() else text)
    except ProtocolError as error:
        raise argparse.ArgumentTypeError(f"{error.problem} (or a time ago: 90s, 15m, 2h, 1d)") from None


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (1 to 65535): {text!r}")
    return int(text)


async def _subscribe(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        if args.existing:
            await _print_deliveries(client, args.id, args)
            return 0
        data = orjson.loads(args.data) if args.data else [parse_constraint(c) for c in args.constraint]
        topk = None
        if args.top_k is not None:
            extent = {"n": args.last} if args.last is not None else {"w": 60000 if args.window is None else args.window}
            topk = {"k": args.top_k, **extent, "score": [parse_score_term(t) for t in args.score]}
        if args.webhook is not None:  # delivered by the broker, not to this command: kept, its secret printed
            hook = {"url": args.webhook, "batch": args.webhook_batch}
            reply = await client.subscribe(data, args.id, topk=topk, scope=args.scope, since=args.since, webhook=hook)
            print(orjson.dumps(reply).decode(), flush=True)
            return 0
        # without --id the subscription is this command's alone: an id of its own, known before the
        # request, so that a stop at any moment removes what was made
        subscription_id = args.id or uuid.uuid4().hex
        made: str | None = None
        try:
            await client.subscribe(data, subscription_id, topk=topk, scope=args.scope, since=args.since)
            if args.id is None:
                made = await _created(client, subscription_id)
            kept = "kept: connect again with --existing --id" if args.id else "removed when this command ends"
            print(f"subscribed: {subscription_id} ({kept})", file=sys.stderr, flush=True)
            await _print_deliveries(client, subscription_id, args)
        finally:
            if args.id is None:
                await _remove_own(client, subscription_id, made)
    return 0


async def _created(client: Any, subscription_id: str) -> str | None:
    """Which subscription of the id this is (the log offset that made it); None where the broker
    does not say (anonymous clients may not list)."""
    from veil.client.errors import Forbidden

    try:
        return (await client.subscription(subscription_id))["created"]
    except Forbidden:
        return None


async def _remove_own(client: Any, subscription_id: str, made: str | None) -> None:
    """Remove the subscription this command made, unless it is gone or was replaced meanwhile by a
    subscribe under its id (which meant to keep it)."""
    from veil.client import VeilError
    from veil.client.errors import NotFound

    try:
        if made is not None and await _created(client, subscription_id) != made:
            print(f"veil subscribe: {subscription_id} was subscribed again meanwhile: kept", file=sys.stderr)
            return
        await client.unsubscribe(subscription_id)
    except NotFound:  # removed meanwhile (`veil subscriptions remove`), or never made
        pass
    except (VeilError, OSError) as exc:
        print(
            f"veil subscribe: subscription {subscription_id} was not removed ({exc}): "
            f"`veil subscriptions remove {subscription_id}` removes it",
            file=sys.stderr,
        )


async def _print_deliveries(client: Any, subscription_id: str, args: argparse.Namespace) -> None:
    left = args.count
    stream = client.deliveries(subscription_id, transport=args.transport, envelope=not args.plain, group=args.group)
    async with stream:
        async for delivery in stream:
            sys.stdout.write(orjson.dumps(delivery.publication if args.plain else _record(delivery)).decode() + "\n")
            sys.stdout.flush()
            if left is not None:
                left -= 1
                if left == 0:
                    return


def _record(delivery: Any) -> dict[str, Any]:
    """A delivery as one JSON line: what every delivery has, then only what this one has besides."""
    out: dict[str, Any] = {"seq": delivery.seq, "id": delivery.id}
    if delivery.publisher is not None:
        out["publisher"] = delivery.publisher
    out["publication"] = delivery.publication
    if delivery.verified:
        out["verified"] = True
    if delivery.cropped:
        out["cropped"] = True
    if delivery.payload is not None:
        out["payload"] = _printable(delivery.payload)
    if delivery.payload_error is not None:
        out["payload_error"] = delivery.payload_error
    if delivery.origin is not None:
        out["origin"] = delivery.origin._asdict()
    return out


def _printable(payload: bytes) -> str:
    """A payload as text where it is UTF-8, otherwise as base64 (marked so)."""
    try:
        return payload.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(payload).decode()


async def _rotate(args: argparse.Namespace) -> int:
    recipients = _json_file(args.recipients, "--recipients")
    if recipients is not None and (
        not isinstance(recipients, dict) or not all(isinstance(v, str) for v in recipients.values())
    ):
        raise SystemExit("veil scope rotate: --recipients is a JSON object: member -> base64 recipient public key")
    try:
        vouched = (
            None
            if recipients is None
            else {member: base64.b64decode(key, validate=True) for member, key in recipients.items()}
        )
    except ValueError as exc:
        raise SystemExit(f"veil scope rotate: --recipients: {exc}") from None
    if args.every is not None and args.every < 1:
        raise SystemExit("veil scope rotate: --every is a number of seconds, at least 1")
    signing_key = _signing_key(args.signing_key, args.key_id)
    async with _client(args) as client:
        while True:  # a rotation now, then every --every seconds: what leaks of one key ages out
            rotation = await client.rotate_scope_key(args.scope, signing_key, vouched)
            print(f"scope {args.scope}: key version {rotation.version} for {', '.join(rotation.members)}", flush=True)
            for member, why in sorted(rotation.left_out.items()):
                print(f"left out {member}: {why}", file=sys.stderr, flush=True)
            if args.every is None:
                return 0
            await asyncio.sleep(args.every)


def _keygen(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from veil.security.sealing import HybridKey, recipient_public

    def pem(key: Any) -> bytes:
        encoding, form = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
        return key.private_bytes(encoding, form, serialization.NoEncryption())

    if args.kind == "ed25519":
        signing = Ed25519PrivateKey.generate()
        text, public = pem(signing), signing.public_key().public_bytes_raw()
        listed = "list this public key under the registry's keys (yours) and in members' --scope-managers:"
    else:
        key = X25519PrivateKey.generate() if args.kind == "x25519" else HybridKey.generate()
        text = pem(key.mlkem) + pem(key.x25519) if isinstance(key, HybridKey) else pem(key)
        public, listed = recipient_public(key), "list this public key under the registry's recipients:"
    try:
        fd = os.open(args.out, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError as exc:
        raise SystemExit(f"veil keygen: --out {args.out}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(text)
    print(f"wrote {args.out}; {listed}")
    print(base64.b64encode(public).decode())
    return 0


async def _unsubscribe(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        await client.unsubscribe(args.id)
    return 0


async def _subscriptions(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        if args.action == "show":
            for sub_id in args.ids:
                print(orjson.dumps(await client.subscription(sub_id)).decode())
        elif args.action == "remove":
            ids = [s["subscriptionId"] for s in await client.subscriptions()] if args.all else args.ids
            for sub_id in ids:
                await client.unsubscribe(sub_id)
                print(f"removed {sub_id}")
        else:
            for doc in await client.subscriptions():
                print(orjson.dumps(doc).decode())
    return 0


async def _dead_letters(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        if args.action == "replay":
            print(f"replayed {await client.replay_dead_letters(args.id, args.upto)}")
        elif args.action == "purge":
            print(f"purged {await client.purge_dead_letters(args.id, args.upto)}")
        else:
            async for letter in client.dead_letters(args.id, args.after):
                print(orjson.dumps(letter).decode())
    return 0


def _token(args: argparse.Namespace) -> int:
    from veil.protocol import ProtocolError
    from veil.security.attributes import parse_attributes
    from veil.security.dev_tokens import JWKS_FILE, mint

    attributes = None
    if args.attributes is not None:
        try:
            attributes = orjson.loads(args.attributes)
            parse_attributes(attributes, "attributes")
        except orjson.JSONDecodeError as exc:
            raise SystemExit(f"veil token: --attributes: not JSON ({exc})") from None
        except ProtocolError as exc:
            raise SystemExit(f"veil token: --attributes: {exc.field}: {exc.problem}") from None
    if not 0 < args.ttl <= 366 * 86400:
        raise SystemExit("veil token: --ttl is a number of seconds, more than 0 and at most a year")
    try:
        token = mint(args.dir, args.subject, args.ttl, args.issuer, args.audience, attributes)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"veil token: --dir {args.dir}: {exc}") from None
    print(f"a token for {args.subject}; the broker verifies it with --jwks {args.dir}/{JWKS_FILE}", file=sys.stderr)
    print(token)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from veil.gateway.server import serve

    config = config_module.load(args)
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.role == "pipeline":
        from veil.pipeline.session import run_apart

        return run_apart(config)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(config))
    return 0


def _certs(args: argparse.Namespace) -> int:
    from veil.protocol import ProtocolError
    from veil.security.attributes import parse_attributes
    from veil.security.certs import create

    attributes = {}
    for entry in args.attributes or []:
        name, _, text = entry.partition("=")
        try:
            attributes[name] = orjson.loads(text)
            parse_attributes(attributes[name], "attributes")
        except orjson.JSONDecodeError as exc:
            print(f"veil certs: --attributes {name}: not JSON ({exc})", file=sys.stderr)
            return 2
        except ProtocolError as exc:
            print(f"veil certs: --attributes {name}: {exc.field}: {exc.problem}", file=sys.stderr)
            return 2
    clients = args.client or []
    unknown = sorted(set(attributes) - set(clients))
    if unknown:
        print(f"veil certs: --attributes {unknown[0]}: not one of the --client names", file=sys.stderr)
        return 2
    identities = create(args.dir, args.hostname or ["localhost", "127.0.0.1", "::1"], clients, attributes)
    print(f"wrote ca.pem, server.pem and server-key.pem to {args.dir}")
    for name, fingerprint in identities.items():
        print(f"client-{name}.pem  authHash {fingerprint}")
    return 0


def _asynchronous(command: Any) -> Any:
    """Run a client command; SIGTERM ends it as Ctrl-C does, through its cleanup (a subscription it
    made is removed), instead of killing it mid-request."""

    async def running(args: argparse.Namespace) -> int:
        task = asyncio.current_task()
        assert task is not None
        terminated: list[bool] = []

        def terminate() -> None:
            terminated.append(True)
            task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
        try:
            return await command(args)
        except asyncio.CancelledError:
            if not terminated:
                raise  # Ctrl-C: asyncio.run raises KeyboardInterrupt, which main answers with 130
            return 128 + signal.SIGTERM

    return lambda args: asyncio.run(running(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="veil", description="Privacy-preserving content-based pub/sub broker")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the broker (gateway + Spark pipeline)")
    config_module.add_arguments(serve)
    serve.set_defaults(run=_serve)

    publish = commands.add_parser("publish", help="publish JSON documents (arguments, or lines on stdin)")
    _client_arguments(publish)
    publish.add_argument("publication", nargs="*", help="a publication in any SELIS form")
    publish.add_argument(
        "--valid-for",
        type=int,
        help="milliseconds it stays valid: subscriptions made meanwhile receive it too (default: none, matched "
        "once and not kept)",
    )
    publish.add_argument(
        "--idempotency-key", metavar="KEY", help="names what is published (the Nth of several documents as KEY#N): "
        "run again within the broker's --idempotency-window, it publishes nothing new and prints the same ids "
        "(default: a random key per document, which covers the command's own retries)",
    )  # fmt: skip
    publish.add_argument(
        "--seal", metavar="SCOPE", help="seal a payload for SCOPE's members, and publish into it (default: none)"
    )
    publish.add_argument(
        "--payload", help="the payload to seal (text; a command line is visible to others on this machine: "
        "prefer --payload-file) (default: none)",
    )  # fmt: skip
    publish.add_argument("--payload-file", help="the payload to seal (a file's bytes; - for stdin) (default: none)")
    publish.set_defaults(run=_asynchronous(_publish))

    unpublish = commands.add_parser("unpublish", help="withdraw a publication of yours that is still valid")
    _client_arguments(unpublish)
    unpublish.add_argument("id", help="the id publish printed")
    unpublish.set_defaults(run=_asynchronous(_unpublish))

    edge = commands.add_parser(
        "edge", help="an edge broker: announce, then publish stdin's JSON lines only while a subscription wants them"
    )
    _client_arguments(edge)
    edge.add_argument("constraint", nargs="*", help="what the local publishers produce, e.g. 'sensor=NO2' 'lat>45'")
    edge.add_argument("--id", help="announcement id; reusing yours replaces it (default: a new random id)")
    edge.set_defaults(run=_asynchronous(_edge))

    bridge = commands.add_parser("bridge", help="carry messages between Veil and another messaging system")
    bridges = bridge.add_subparsers(dest="bridge", required=True)
    mqtt = bridges.add_parser(
        "mqtt", help="MQTT topics published into Veil, and Veil subscriptions' deliveries published to MQTT topics"
    )
    _client_arguments(mqtt)
    mqtt.add_argument(
        "--mqtt", help=f"the MQTT broker: mqtt://[USER:PASSWORD@]HOST[:PORT] or mqtts://... (default: {DEFAULT_MQTT}; "
        "environment VEIL_MQTT)",
    )  # fmt: skip
    mqtt.add_argument("--mqtt-ca", help="CA file to verify an mqtts:// broker's certificate (default: the system's)")
    mqtt.add_argument("--mqtt-cert", help="client certificate for an mqtts:// broker (default: none)")
    mqtt.add_argument("--mqtt-key", help="private key of --mqtt-cert (default: none)")
    mqtt.add_argument(
        "--client-id", default="veil-bridge",
        help="MQTT client id: the broker keeps the bridge's session under it (what comes while the bridge is "
        "down waits for it); one bridge per id (default: veil-bridge)",
    )  # fmt: skip
    mqtt.add_argument(
        "--topic", action="append", default=[], metavar="TEMPLATE",
        help="publish the messages of these MQTT topics into Veil, the levels named in braces as attributes beside "
        "the JSON payload's members, e.g. 'sensors/{site}/{floor:int}/#' (+ and a last # match without naming; "
        "repeatable; default: none)",
    )  # fmt: skip
    mqtt.add_argument(
        "--value-attribute", default="value",
        help="the attribute a payload that is no JSON object goes under (a number, or text) (default: value)",
    )  # fmt: skip
    mqtt.add_argument(
        "--deliver", action="append", default=[], metavar="SUBSCRIPTION_ID=TOPIC",
        help="publish the deliveries of this subscription of yours (made beforehand, e.g. `veil subscribe --id`) "
        "to this MQTT topic, {name} levels filled from the publication's attributes, e.g. 'alerts/{site}' "
        "(repeatable; default: none)",
    )  # fmt: skip
    mqtt.add_argument(
        "--tcp-port", type=_port,
        help="the broker's TCP delivery port, for --deliver (default: the REST port + 1)",
    )  # fmt: skip
    mqtt.add_argument(
        "--journal",
        help="file keeping the idempotency keys of the messages in flight, so that one MQTT sends again after the "
        "bridge died is published once; one bridge at a time (default: veil-bridge-HOST-PORT-CLIENT_ID.journal in the "
        "working directory)",
    )
    mqtt.add_argument(
        "--log-level", choices=config_module.LOG_LEVELS, default="info",
        help="log level (default: info)",
    )  # fmt: skip
    mqtt.set_defaults(run=_asynchronous(_bridge_mqtt))

    subscribe = commands.add_parser("subscribe", help="subscribe and print deliveries as they arrive")
    _client_arguments(subscribe)
    subscribe.add_argument("constraint", nargs="*", help="KEY OP VALUE, e.g. 'lat>14' 'lon<53' (all must hold)")
    subscribe.add_argument("--data", help="the constraints as a SELIS JSON array instead (default: none)")
    subscribe.add_argument(
        "--id", help="subscription id; reusing yours replaces it, and it is kept when the command ends (default: "
        "a random id, removed when the command ends)",
    )  # fmt: skip
    subscribe.add_argument("--existing", action="store_true", help="only connect to the existing subscription --id")
    subscribe.add_argument(
        "--webhook", metavar="URL",
        help="have the broker POST the deliveries to this https endpoint instead, and print the subscription's id "
        "and the secret that signs them (needs --id: the subscription is kept) (default: none)",
    )  # fmt: skip
    subscribe.add_argument(
        "--webhook-batch", type=int, default=1, help="with --webhook: most deliveries in one request (default: 1)"
    )
    subscribe.add_argument(
        "--group", action="store_true",
        help="with --existing: join the subscription's group, sharing its deliveries with the other members "
        "(each delivery printed by one of them)",
    )  # fmt: skip
    subscribe.add_argument(
        "--transport", choices=("tcp", "ws"), default="tcp", help="the delivery connection (default: tcp)"
    )
    subscribe.add_argument(
        "--tcp-port", type=_port,
        help="the broker's TCP delivery port, for --existing (default: the one /subscribe names, else the REST "
        "port + 1)",
    )  # fmt: skip
    subscribe.add_argument(
        "--ws-port", type=_port,
        help="the broker's WebSocket delivery port, for --existing (default: the one /subscribe names, else the "
        "REST port + 2)",
    )  # fmt: skip
    subscribe.add_argument(
        "--plain", action="store_true",
        help="print each publication alone, as the SELIS line protocol delivers it (no envelope: no seq, id, "
        "publisher or opened payload)",
    )  # fmt: skip
    subscribe.add_argument("--count", type=int, help="exit after this many deliveries (default: never)")
    subscribe.add_argument(
        "--since", type=_since,
        help="first receive what it matches of the publications the broker retains (its --retention) that were "
        "logged since then: an RFC 3339 time (2026-11-29T08:00:00Z), milliseconds since the epoch, or a time ago "
        "(90s, 15m, 2h, 1d) (default: none, only what is published from now on)",
    )  # fmt: skip
    subscribe.add_argument(
        "--top-k", type=int, help="top-k/w: only the K best matches of each window (default: none, all matches)"
    )
    subscribe.add_argument(
        "--window", type=float, help="top-k/w window in milliseconds (default: 60000, unless --last)"
    )
    subscribe.add_argument(
        "--last", type=int, help="top-k of the last N matching publications, instead of a --window (default: none)"
    )
    subscribe.add_argument(
        "--score",
        action="append",
        default=[],
        help="top-k/w scoring term: KEY:high, KEY:low or KEY=TARGET[*WEIGHT] (repeatable; default: none)",
    )
    subscribe.add_argument("--scope", help="subscribe in this scope, if you are a member (default: none, the world)")
    subscribe.set_defaults(run=_asynchronous(_subscribe))

    scope = commands.add_parser("scope", help="manage a scope's sealing key (its managers)")
    scope_commands = scope.add_subparsers(dest="scope_command", required=True)
    rotate = scope_commands.add_parser(
        "rotate", help="a new key version, signed, for every current member whose recipient key you vouch for"
    )
    _client_arguments(rotate)
    rotate.add_argument("scope", help="the scope's name")
    rotate.add_argument(
        "--signing-key", required=True, help="your Ed25519 private key (PEM, `veil keygen --kind ed25519`; required)"
    )
    rotate.add_argument("--key-id", required=True, help="its id, as the registry's keys list it for you (required)")
    rotate.add_argument(
        "--recipients",
        help="JSON file: member -> base64 recipient public key: exactly these members get the key (if the "
        "registry lists them with these keys) (default: none: the last roster's members the registry still lists)",
    )
    rotate.add_argument(
        "--every", type=float, metavar="SECONDS",
        help="keep running and rotate again every SECONDS; the versions seen are remembered between them "
        "(default: none, rotate once)",
    )  # fmt: skip
    rotate.set_defaults(run=_asynchronous(_rotate))

    keygen = commands.add_parser("keygen", help="create a recipient key for sealed payloads, or a signing key")
    keygen.add_argument(
        "--out", default="recipient-key.pem",
        help="where the private key goes; an existing file is not overwritten (default: recipient-key.pem)",
    )  # fmt: skip
    keygen.add_argument(
        "--kind", choices=("x25519", "hybrid", "ed25519"), default="x25519",
        help="x25519 or hybrid (ML-KEM-768 with X25519) recipient key, or an ed25519 signing key (managers) "
        "(default: x25519)",
    )  # fmt: skip
    keygen.set_defaults(run=_keygen)

    unsubscribe = commands.add_parser("unsubscribe", help="remove a subscription")
    _client_arguments(unsubscribe)
    unsubscribe.add_argument("id", help="subscription id")
    unsubscribe.set_defaults(run=_asynchronous(_unsubscribe))

    subscriptions = commands.add_parser(
        "subscriptions", help="list, show or remove your own subscriptions (default: list them)"
    )
    _client_arguments(subscriptions)
    subscriptions.add_argument(
        "action", nargs="?", choices=("list", "show", "remove"), default="list",
        help="list: one JSON line per live subscription of yours; show ID...; remove ID... (or --all)",
    )  # fmt: skip
    subscriptions.add_argument("ids", nargs="*", metavar="ID", help="subscription ids (show, remove)")
    subscriptions.add_argument("--all", action="store_true", help="remove: every subscription of yours")
    subscriptions.set_defaults(run=_asynchronous(_subscriptions))

    dead = commands.add_parser(
        "dead-letters",
        help="list, replay or purge what left a subscription's queue past its bounds (yours; any one's for an admin)",
    )
    _client_arguments(dead)
    dead.add_argument(
        "action", nargs="?", choices=("list", "replay", "purge"), default="list",
        help="list: one JSON line per dead letter, oldest first, with its seq, reason and publication; replay: queue "
        "them again, in their order; purge: drop them (default: list)",
    )  # fmt: skip
    dead.add_argument("id", help="subscription id")
    dead.add_argument("--after", type=int, default=0, help="list: the dead letters after this seq (default: all)")
    dead.add_argument("--upto", type=int, help="replay, purge: those up to this seq (default: all)")
    dead.set_defaults(run=_asynchronous(_dead_letters))

    token = commands.add_parser(
        "token", help="development identity provider: a bearer token signed with a key of --dir (made once)"
    )
    token.add_argument("--dir", default="tokens", help="the provider's key and jwks.json (default: tokens)")
    token.add_argument("--subject", required=True, help="whom the token names (its sub claim)")
    token.add_argument("--ttl", type=float, default=3600, help="seconds until it expires (default: 3600)")
    token.add_argument("--issuer", help="its iss claim, for --token-issuer (default: none)")
    token.add_argument("--audience", help="its aud claim, for --token-audience (default: none)")
    token.add_argument(
        "--attributes", metavar="JSON", help='its veil claim, e.g. \'{"scopes": ["customs"]}\' (default: none)'
    )
    token.set_defaults(run=_token)

    certs = commands.add_parser("certs", help="create a development CA, server and client certificates")
    certs.add_argument("--dir", default="certs", help="output directory (default: certs)")
    certs.add_argument(
        "--hostname", action="append",
        help="server name or address (repeatable; default: localhost, 127.0.0.1 and ::1)",
    )  # fmt: skip
    certs.add_argument("--client", action="append", help="client certificate name (repeatable; default: none)")
    certs.add_argument(
        "--attributes",
        action="append",
        metavar="NAME=JSON",
        help='attributes a client certificate states, e.g. alice=\'{"scopes": ["customs"]}\' (repeatable; '
        "default: none)",
    )
    certs.set_defaults(run=_certs)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "subscribe" and not (
        args.existing or args.data is not None or args.constraint or args.top_k is not None
    ):
        parser.error("subscribe: give constraints, --data, --top-k, or --existing --id ID")
    if args.command == "subscribe" and args.top_k is not None and not args.score:
        parser.error("subscribe --top-k needs at least one --score term")
    if args.command == "subscribe" and args.last is not None and args.top_k is None:
        parser.error("subscribe --last: the window of a --top-k subscription (give --top-k K)")
    if args.command == "subscribe" and args.last is not None and args.window is not None:
        parser.error("subscribe: a window is --window MILLISECONDS or --last N publications, not both")
    if args.command == "subscribe" and args.last is not None and args.last < 1:
        parser.error("subscribe --last: at least 1 publication")
    if args.command == "subscribe" and args.existing and not args.id:
        parser.error("subscribe --existing needs --id")
    if args.command == "subscribe" and args.webhook is not None and (args.id is None or args.existing):
        parser.error("subscribe --webhook needs --id (the subscription is kept), and no --existing")
    if args.command == "subscribe" and args.group and not args.existing:
        parser.error("subscribe --group joins the group of an existing subscription: give --existing --id ID")
    if args.command == "subscribe" and args.group and args.plain:
        parser.error("subscribe --group: a member acknowledges what it takes, by the envelope's seq (not --plain)")
    if args.command == "subscribe" and args.id == "":
        parser.error("subscribe --id: an id is not empty (leave --id out for one of the command's own)")
    if args.command == "subscribe" and args.count is not None and args.count < 1:
        parser.error("subscribe --count: at least 1 (leave it out to print deliveries until stopped)")
    if args.command == "subscriptions" and args.action in ("show", "remove") and not (args.ids or args.all):
        parser.error(f"subscriptions {args.action}: give the ids{' (or --all)' if args.action == 'remove' else ''}")
    if args.command == "subscriptions" and (args.ids or args.all) and args.action == "list":
        parser.error("subscriptions list takes no ids: show ID... or remove ID...")
    if args.command == "subscriptions" and args.all and (args.ids or args.action != "remove"):
        parser.error("subscriptions --all goes with remove, and without ids")
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
    except ValueError as exc:
        print(f"veil {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from veil.client import VeilError

        if isinstance(exc, VeilError | OSError):
            print(f"veil {args.command}: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
