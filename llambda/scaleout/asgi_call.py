"""Run one HTTP request through an ASGI app in this process: how a replica serves what the ingress
forwards with the very app `llambda serve` runs (routes, limits, auth, SSE), without a socket."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

from .forwarding import ForwardedRequest

_DONE = object()


async def call_asgi(app, req: ForwardedRequest) -> AsyncIterator[dict | bytes]:
    """Yields {"status", "headers"} once, then the body's chunks as the app sends them. Closing the
    iterator early (the client went away) tells the app its client disconnected."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": req.method, "scheme": "http", "path": req.path, "raw_path": req.path.encode(),
             "query_string": req.query, "root_path": "", "headers": list(req.headers),
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_given = False

    async def receive():
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await gone.wait()           # after the body, the next message is the hang-up
        return {"type": "http.disconnect"}

    async def send(message):
        await sent.put(message)

    async def run():
        try:
            await app(scope, receive, send)
        finally:
            await sent.put(_DONE)

    task = asyncio.create_task(run())
    try:
        while True:
            message = await sent.get()
            if message is _DONE:
                break
            if message["type"] == "http.response.start":
                yield {"status": message["status"], "headers": list(message.get("headers", []))}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
        await task
    finally:
        gone.set()
        if not task.done():
            try:
                await asyncio.wait_for(task, 5.0)   # the app cancels its generation and returns
            except (asyncio.TimeoutError, Exception):
                task.cancel()
