"""The live dashboard (`GET /dashboard`): a static page that reads /metrics every second and plots
it, for operators without a Prometheus and Grafana at hand. Its files are in the package (uPlot
vendored from the npm registry, MIT), so serving it needs no build step and no network."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from aiohttp import web

STATIC = files("veil.monitoring") / "static"
ASSETS = {  # what the page loads: name -> media type (nothing else under static/ is served)
    "dashboard.js": "text/javascript",
    "uplot/uPlot.iife.min.js": "text/javascript",
    "uplot/uPlot.min.css": "text/css",
}
CACHE = "no-cache"  # revalidated on each load, so a broker upgrade never runs an old script
routes = web.RouteTableDef()


@cache
def _file(name: str) -> bytes:
    """Read once: the files are part of the installed package."""
    return (STATIC / name).read_bytes()


@routes.get("/dashboard")
async def page(request: web.Request) -> web.Response:
    return web.Response(body=_file("dashboard.html"), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": CACHE})  # fmt: skip


@routes.get("/dashboard/{asset:.+}")
async def asset(request: web.Request) -> web.Response:
    name = request.match_info["asset"]
    media = ASSETS.get(name)
    if media is None:
        raise web.HTTPNotFound()
    return web.Response(body=_file(name), content_type=media, charset="utf-8",
                        headers={"Cache-Control": CACHE})  # fmt: skip
