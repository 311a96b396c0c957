"""What every router of the API shares: the JSON answer, the bearer token, a domain named in
a URL, and a validation error as `field.path: message`."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Header, HTTPException
from fastapi.responses import Response
from pydantic_core import to_json

from decider.facility import DomainRef
from decider.placement.view import View
from decider.service import Service


def json_response(content: Any, status_code: int = 200) -> Response:
    # pydantic-core's serializer: several times faster than json.dumps on 10,000 verdicts.
    return Response(to_json(content), status_code=status_code, media_type="application/json")


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
