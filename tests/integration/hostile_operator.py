"""An operator who acts, standing between clients and a real broker: its REST port (`HostileGateway`)
and its delivery port (`Relay`) pass everything through, keep a copy of every byte they carried, and
change what the test tells them to."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import orjson
from aiohttp import web

from veil.harness.broker import free_ports

Rewrite = Callable[[web.Request, dict], dict]  # (request, the broker's JSON answer) -> the answer sent
PASSED_HEADERS = ("X-Auth-Hash", "X-Registry-Version", "Content-Type", "X-Key-Id", "X-Signature", "Authorization")


class HostileGateway:
    """A REST front: answers to paths in `rewrites` are what the operator makes of the broker's."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.rewrites: dict[str, Rewrite] = {}
        self.carried = bytearray()  # every request and answer body it saw
        self.published: list[dict] = []  # the publications clients sent through it

    async def __aenter__(self) -> HostileGateway:
        self.session = aiohttp.ClientSession()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{path:.*}", self._pass)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.runner.cleanup()
        await self.session.close()

    async def _pass(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.carried += body
        if request.path == "/publish":
            self.published += [orjson.loads(line) for line in body.splitlines() if line.strip()]
        headers = {h: request.headers[h] for h in PASSED_HEADERS if h in request.headers}
        async with self.session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as answer:
            status, payload = answer.status, await answer.read()
            passed = {h: answer.headers[h] for h in ("X-Registry-Version", "Retry-After") if h in answer.headers}
        rewrite = self.rewrites.get(request.path)
        if rewrite is not None and status == 200:
            payload = orjson.dumps(rewrite(request, orjson.loads(payload)))
        self.carried += payload
        return web.Response(status=status, body=payload, content_type="application/json", headers=passed)

    async def upstream_json(self, path: str, auth_hash: str) -> dict:
        """What the broker answers the operator itself (it holds every client's answers anyway)."""
        async with self.session.get(self.upstream + path, headers={"X-Auth-Hash": auth_hash}) as answer:
            return orjson.loads(await answer.read())


class Relay:
    """A delivery port: lines pass on under the relay's own sequence numbers, after whatever `before`
    writes (lines it invents), and `again` writes a line it passed once more, as new."""

    def __init__(self, upstream: int, before: Callable[[dict], list[dict]] | None = None) -> None:
        self.upstream = upstream
        self.port = free_ports(1)[0]
        self.before = before
        self.passed: list[dict] = []
        self.carried = bytearray()
        self._writers: list[asyncio.StreamWriter] = []
        self._seq = 0

    async def __aenter__(self) -> Relay:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        self.server.close()

    def _write(self, writer: asyncio.StreamWriter, doc: dict) -> None:
        self._seq += 1
        writer.write(orjson.dumps({**doc, "seq": self._seq}) + b"\n")

    async def again(self, index: int) -> None:
        """Line `index` of those passed, delivered once more on every connection, as a new one."""
        for writer in self._writers:
            self._write(writer, self.passed[index])
            await writer.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers.append(writer)

        async def upward() -> None:
            while line := await reader.readline():
                self.carried += line
                if not line.startswith(b'{"ack":'):  # acknowledgements name the relay's numbers, not the broker's
                    up_writer.write(line)
                    await up_writer.drain()

        task = asyncio.create_task(upward())
        try:
            while line := await up_reader.readline():
                self.carried += line
                doc = orjson.loads(line)
                if "seq" not in doc:
                    writer.write(line)
                    continue
                for invented in self.before(doc) if self.before else ():
                    self._write(writer, invented)
                self.passed.append(doc)
                self._write(writer, doc)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.remove(writer)
            task.cancel()
            up_writer.close()
            writer.close()
