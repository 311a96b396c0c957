"""What every router of the API shares: the JSON answer, the bearer token (checked before
the body is read), a domain named in a URL, and a validation error as `field.path: message`.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine, Mapping
from typing import Annotated, Any

from fastapi import Header, HTTPException
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic_core import to_json
from starlette.requests import Request

from decider.facility import DomainRef
from decider.placement.view import View
from decider.service import Service


def json_response(content: Any, status_code: int = 200) -> Response:
    # pydantic-core's serializer: several times faster than json.dumps on 10,000 verdicts.
    # A non-finite figure is written null (unknown), never NaN or Infinity, which strict
    # JSON parsers (Go's encoding/json, a scheduler's client) refuse.
    return Response(
        to_json(content, inf_nan_mode="null"),
        status_code=status_code,
        media_type="application/json",
    )


def problem_response(status_code: int, detail: str, *, close: bool = False) -> Response:
    """`{"detail": …}`; `close`: the connection ends after it (a body left unread)."""
    response = json_response({"detail": detail}, status_code)
    if close:
        response.headers["Connection"] = "close"
    return response


class RequireToken:
    """The dependency of every mutating route: `Authorization: Bearer <token_file's token>`,
    else 401 (403 when the decider has no token file)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def __call__(self, authorization: Annotated[str | None, Header()] = None) -> None:
        token = self.service.token
        if token is None:
            raise HTTPException(
                403, "mutating calls are disabled: the decider has no token_file configured"
            )
        scheme, _, given = (authorization or "").partition(" ")
        # Bytes: compare_digest refuses str with non-ASCII characters (a 500, not a 401).
        presented = given.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented, token.encode()):
            raise HTTPException(
                401,
                "a bearer token is required: Authorization: Bearer <token_file's token>",
                headers={"WWW-Authenticate": "Bearer"},
            )


class TokenFirstRoute(APIRoute):
    """A route whose RequireToken dependency runs before anything reads the request's body.

    FastAPI reads and parses a body before it runs a route's dependencies: an unauthenticated
    100 MB reservation was read and parsed to be refused (issue 16). This route checks the
    token on the request's headers first, then hands the request to FastAPI's own handler
    (which runs the dependency again: cheap, and what the OpenAPI document describes).
    Public APIs only: `get_route_handler` (FastAPI's documented way to customise a route)
    and the route's `dependencies`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        usual = super().get_route_handler()
        checks = [
            depends.dependency
            for depends in self.dependencies
            if isinstance(depends.dependency, RequireToken)
        ]
        if not checks:
            return usual
        check = checks[0]

        async def handler(request: Request) -> Response:
            check(request.headers.get("authorization"))
            return await usual(request)

        return handler


def known_domain(view: View, kind: str, name: str) -> DomainRef:
    """The domain `kind/name` of a URL; 404 when the View knows no such domain."""
    try:
        ref = DomainRef.parse(f"{kind}/{name}")
    except ValueError as exc:
        raise HTTPException(404, str(exc)) from exc
    if ref not in view.domain_refs:
        raise HTTPException(
            404,
            f"no domain {ref}: neither in the facility file nor among the nodes' domains",
        )
    return ref


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part != "body") or "body"


def problem(error: Mapping[str, Any]) -> str:
    """One validation error as `field.path: message`."""
    if error.get("type") == "json_invalid":  # loc is ("body", character offset)
        position = error["loc"][-1] if len(error["loc"]) > 1 else 0
        reason = error.get("ctx", {}).get("error", "JSON decode error")
        return f"body: not valid JSON at character {position}: {reason}"
    return f"{_field(tuple(error['loc']))}: {error['msg']}"
