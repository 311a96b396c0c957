"""Request bodies past a limit get 413 before they are read whole (docs/decider.md, "The
HTTP API"): a declared Content-Length past it at once, unread; a chunked body once what
came passes it. A plain ASGI middleware: it reads nothing of FastAPI's or Starlette's.

The limits: a placement names up to 100,000 candidates, 16 MiB (100,000 names of 150
characters); every other body is a reservation, a hold or nothing, 64 KiB. A caller
without the token is refused before its body is read at all (decider.api.http).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from decider.api.http import problem_response

MAX_PLACEMENT_BODY_BYTES = 16 * 2**20
MAX_BODY_BYTES = 64 * 2**10
#: Per path, where the limit is not MAX_BODY_BYTES.
LIMITS = {"/v1/placements": MAX_PLACEMENT_BODY_BYTES}


class BodyTooLarge(HTTPException):
    """Raised by the capped `receive` in whatever reads the body: an HTTPException, so that
    FastAPI passes it on as it is and the app's handler answers it (the same 413 as
    `_refuse`)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, _detail(limit), headers={"Connection": "close"})
        self.limit = limit


class BodyLimit:
    """ASGI middleware: at most `LIMITS.get(path, MAX_BODY_BYTES)` bytes of body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = LIMITS.get(scope["path"], MAX_BODY_BYTES)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(limit, scope, receive, send)
            return
        received = 0
        started = False

        async def capped_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, capped_receive, watched_send)
        except BodyTooLarge as exc:
            if started:  # the answer began before the body was read: nothing left to say
                raise
            await _refuse(exc.limit, scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses such a request before it comes here
    return None


async def _refuse(limit: int, scope: Scope, receive: Receive, send: Send) -> None:
    # Connection: close: the rest of the body is never read, so the connection cannot
    # carry another request.
    response = problem_response(413, _detail(limit), close=True)
    await response(scope, receive, send)


def _detail(limit: int) -> str:
    return f"body: larger than this call's limit of {limit} bytes"
