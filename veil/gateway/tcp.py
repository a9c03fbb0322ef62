"""TCP (TLS when configured) line delivery, SPEC §2.4: one handshake line in, one JSON document per
line out; optional acknowledgement lines back."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from veil.gateway.channel import cut_off_later
from veil.gateway.connection import MAX_LINE, serve_connection
from veil.gateway.context import Gateway
from veil.protocol import ProtocolError
from veil.security.tls import peer_certificate


async def start_tcp(gateway: Gateway, host: str, port: int, context: ssl.SSLContext | None) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        gateway.unproven.watch(writer, lambda reason: _refuse(writer, ProtocolError("handshake", reason).to_json()))
        try:
            with gateway.health.connection():
                await _serve(gateway, reader, writer)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            gateway.unproven.settle(writer)
            _close(writer)
            with contextlib.suppress(Exception):  # (however it went)
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port, ssl=context, limit=MAX_LINE)


def _refuse(writer: asyncio.StreamWriter, error: bytes) -> None:
    """Close with an error line first (unless closed already)."""
    if not writer.is_closing():
        writer.write(error + b"\n")
    _close(writer)


def _close(writer: asyncio.StreamWriter) -> None:
    """Close once what was written is taken (`cut_off_later`)."""
    writer.close()
    cut_off_later(writer.transport)


async def _serve(gateway: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    async def send(frames: list[bytes]) -> None:
        writer.write(b"\n".join(frames) + b"\n")
        await writer.drain()

    async def close(error: bytes | None) -> None:
        if error is None:
            _close(writer)
        else:
            _refuse(writer, error)

    timeout = gateway.config.read_timeout
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except TimeoutError:
        await close(ProtocolError("handshake", f"no handshake line within {timeout:g} s").to_json())
        return
    except ValueError:
        await close(ProtocolError("handshake", f"handshake line longer than {MAX_LINE} bytes").to_json())
        return
    gateway.unproven.settle(writer)
    if not line.strip():
        await close(ProtocolError("handshake", "empty handshake line").to_json())
        return

    async def receive() -> bytes | None:
        try:
            return await reader.readline() or None
        except ValueError:
            return None  # an over-long client line: the client is not speaking the protocol

    certificate = peer_certificate(writer.get_extra_info("ssl_object"))
    await serve_connection(gateway, line, certificate, send, close, receive)
