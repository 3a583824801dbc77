"""What the non-OpenAI-shaped endpoints share: one choice's output as plain deltas, and the HTTP
plumbing handed in by app.py.

`Generation.stream()` speaks OpenAI's chunk format. /infill, /v1/responses and
/v1/messages each have a stream format of their own, so they read the same
generation through `deltas(gen)`: reasoning (a harmony answer's analysis channel), text and
tool-call deltas (parsed as in chat completions), then the finish. Those APIs have no `n`: one choice.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .accesslog import GENERATION_KEY
from .errors import bad_request
from .generation import ClientGone, Generation, check_event
from .openai_format import dumps, tool_finish
from .scheduler import PromptLogprobs
from .schemas import _type

SSE_TYPE = "text/event-stream; charset=utf-8"


@dataclass
class Delta:
    text: str = ""
    calls: list = field(default_factory=list)   # OpenAI tool-call deltas: {"index", "id"?, "function": {...}}
    finish: str | None = None                   # on the last one: "stop" | "length" | "tool_calls"
    reasoning: str = ""                         # harmony's analysis text; it comes before `text`


async def deltas(gen: Generation) -> AsyncIterator[Delta]:
    """The generation's only choice as it arrives (events a step apart are coalesced: the client may lag).

    Raises ClientGone when the client hangs up and APIError when the job fails; cancels the job on exit.
    """
    st = gen.states[0]
    parser = st.tool_parser
    try:
        while True:
            evs = []
            for _, ev in await gen.channel.get():
                check_event(ev)
                if not isinstance(ev, PromptLogprobs):
                    evs.append(ev)
            text = "".join(gen._absorb(0, ev) for ev in evs)
            st.parts.append(text)
            calls: list = []
            if parser is not None:
                text, calls = parser.feed(text)
            finish = st.finish_reason
            if finish and parser is not None:
                rest, more = parser.finish()
                text, calls = text + rest, calls + more
                finish = tool_finish(finish, bool(parser.calls))
            reasoning = parser.take_reasoning() if parser is not None else ""
            if text or calls or finish or reasoning:
                yield Delta(text, calls, finish, reasoning)
            if finish:
                return
    finally:
        gen.cancel()


def stop_sequence(gen: Generation) -> str | None:
    """The stop string that ended the (finished) only choice, if one did."""
    stop = gen.jobs[0].seq.stop
    return stop.matched if stop is not None else None


def array_of(v: Any, name: str, what: str, limit: int | None = None) -> list:
    """A JSON array field ([] for null), or a 400 naming the field."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise bad_request(f"'{name}' must be an array of {what}, got {_type(v)}", param=name)
    if limit is not None and len(v) > limit:
        raise bad_request(f"'{name}' may hold at most {limit} {what}, got {len(v)}", param=name)
    return v


def sse_event(name: str, obj: Any) -> bytes:
    """An SSE message with an event name (the Responses and Anthropic streams name theirs)."""
    return f"event: {name}\ndata: {dumps(obj)}\n\n".encode()


async def _until_gone(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A stream that just ends when its client hangs up (nobody is left to tell)."""
    try:
        async for chunk in chunks:
            yield chunk
    except ClientGone:
        pass
    finally:
        await chunks.aclose()


async def disconnected(receive) -> bool:
    """True once the client hangs up (after the body, the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    return True


@dataclass
class Http:
    """What the endpoint modules need from app.py, handed in so that they do not import it."""
    read_body: Callable[[Request], Awaitable[Any]]      # the JSON body within the server's limits
    watch_disconnect: Callable[..., Awaitable[None]]    # (receive, gen): tells gen when the client hangs up
    event_stream: Callable[..., Any]                     # (gen, chunks, media_type) -> a streamed response
                                                         # that cancels gen
    json_response: Callable[..., Response]

    async def body(self, request: Request):
        """The JSON body, or None when the client left while sending it."""
        try:
            return await self.read_body(request)
        except ClientDisconnect:
            return None

    async def parsed(self, request: Request, parse: Callable[[Any], Any], in_thread: bool):
        """`parse(body)`, or None when the client left while sending the body. `in_thread`: parse in
        a worker thread, for a parse that may read much more than the body."""
        body = await self.body(request)
        if body is None:
            return None
        return await asyncio.to_thread(parse, body) if in_thread else parse(body)

    async def generate(self, request: Request, service, parse: Callable[[Any], tuple],
                       in_thread: bool = False) -> Response:
        """The usual life of a generating request: `parse(body)` gives (spec, run_of), `run_of(gen)`
        an object whose `stream()` yields SSE bytes and `collect()` returns the whole answer (an
        object, or its JSON encoded already)."""
        parsed = await self.parsed(request, parse, in_thread)
        if parsed is None:
            return Response(status_code=499)
        spec, run_of = parsed
        return await self.run(request, service, spec, run_of)

    async def count(self, request: Request, service, parse: Callable[[Any], Any], answer: Callable[[int], dict],
                    in_thread: bool = False) -> Response:
        """A token-counting request: `parse(body)` gives the spec, `answer(n)` the object saying its
        prompt has n tokens (rendered and tokenized as a generation would, nothing queued)."""
        spec = await self.parsed(request, parse, in_thread)
        if spec is None:
            return Response(status_code=499)
        return self.json_response(answer(await service.count_prompt(spec)))

    async def run(self, request: Request, service, spec, run_of: Callable[[Generation], Any],
                  media_type: str = SSE_TYPE) -> Response:
        """Start `spec` and answer with `run_of(gen)`: its `stream()` as a `media_type` stream, or
        its `collect()` as JSON."""
        gen = await self.started(request, service, spec)
        if gen is None:
            return Response(status_code=499)
        request.scope[GENERATION_KEY] = gen     # the access log reads its token counts
        run = run_of(gen)
        if spec.stream:
            return self.event_stream(gen, _until_gone(run.stream()), media_type)
        result = await self.finish(request, gen, run.collect())
        if result is None:
            return Response(status_code=499)
        return Response(result, media_type="application/json") if isinstance(result, bytes) \
            else self.json_response(result)

    async def started(self, request: Request, service, spec) -> Generation | None:
        """`service.start(spec)`, or None when the client hangs up first: a request still waiting for a
        worker is dropped from its queue, never run (the image worker's: a request's images take seconds
        of the vision tower each, and one left behind held every later image request back); one already
        running finishes its step, its result thrown away; a generation started just as the client
        left is cancelled."""
        start = asyncio.ensure_future(service.start(spec))
        gone = asyncio.ensure_future(disconnected(request.receive))
        try:
            await asyncio.wait((start, gone), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:       # this handler cancelled (the server stopping): its start with it
            start.cancel()
            raise
        finally:
            if not gone.done():
                gone.cancel()
        if not (gone.done() and not gone.cancelled() and gone.exception() is None):
            return await start          # done, or a receive that failed: the request goes on as before
        if not start.done():
            start.cancel()      # its worker's future with it: a job not yet begun is skipped
            return None
        if start.exception() is None:
            start.result().cancel()
        return None

    async def finish(self, request: Request, gen: Generation, work: Awaitable[Any]):
        """Await `work` (which consumes `gen`), cancelling it when the client hangs up; None if it did."""
        watcher = asyncio.create_task(self.watch_disconnect(request.receive, gen))
        try:
            return await work
        except ClientGone:
            return None
        finally:
            watcher.cancel()
            gen.cancel()
