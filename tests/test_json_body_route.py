"""decider/json_body_route.py: the placement's body parsed by pydantic-core in one step, and
everything else as FastAPI answers it.

Two apps with the same endpoint, one on a JSONBodyRoute and one on FastAPI's own route,
driven through ASGI: the same answers to good bodies, to bad ones, to other content types,
and the same OpenAPI document.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from decider.json_body_route import JSONBodyRoute


class Item(BaseModel):
    name: str = Field(min_length=1)
    count: int = Field(ge=0)


class Order(BaseModel):
    item: Item
    notes: list[str] = Field(max_length=3)


def make_app(fast: bool, parsed: list[str]) -> FastAPI:
    app = FastAPI(title="t", version="1")

    @app.exception_handler(RequestValidationError)
    async def _bad(_request: Request, exc: RequestValidationError) -> Response:
        return JSONResponse({"problems": [str(e["loc"]) + e["msg"] for e in exc.errors()]}, 422)

    async def orders(body: Order) -> Response:
        parsed.append(type(body).__name__)
        return Response(body.model_dump_json().encode(), media_type="application/json")

    app.router.add_api_route(
        "/orders",
        orders,
        methods=["POST"],
        summary="an order",
        route_class_override=JSONBodyRoute if fast else None,
    )
    return app


def call(
    app: FastAPI, body: bytes, content_type: str | None = "application/json"
) -> tuple[int, bytes]:
    """One POST /orders through the app's ASGI interface: (status, body)."""

    async def run() -> tuple[int, bytes]:
        sent = False
        out: dict[str, Any] = {"status": None, "body": []}

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
            elif message["type"] == "http.response.body":
                out["body"].append(message.get("body", b""))

        headers = [(b"content-length", str(len(body)).encode())]
        if content_type is not None:
            headers.append((b"content-type", content_type.encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/orders",
            "raw_path": b"/orders",
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 2),
        }
        await app(scope, receive, send)
        return out["status"], b"".join(out["body"])

    return asyncio.run(run())


GOOD = json.dumps({"item": {"name": "gpu", "count": 2}, "notes": ["a"]}).encode()
BAD = [
    b'{"item": {"name": "", "count": -1}, "notes": ["a", "b", "c", "d"]}',
    b'{"item": {"name": "gpu", "count": 2}, "notes": [], "extra": 1}',
    b'{"item": ',
    b"[1, 2]",
    b"",
    b'{"item": {"name": "gpu", "count": NaN}, "notes": []}',
]


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", None]
)
@pytest.mark.parametrize("body", [GOOD, *BAD])
def test_the_answer_is_fastapis_whatever_the_body(body: bytes, content_type: str | None) -> None:
    fast_parsed: list[str] = []
    usual_parsed: list[str] = []
    fast = call(make_app(True, fast_parsed), body, content_type)
    usual = call(make_app(False, usual_parsed), body, content_type)
    assert fast == usual
    assert fast_parsed == usual_parsed


def test_a_good_body_is_answered_without_fastapis_own_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("FastAPI's own body handling ran")

    parsed: list[str] = []
    app = make_app(True, parsed)
    monkeypatch.setattr("fastapi.routing.solve_dependencies", refuse)
    status, content = call(app, GOOD)
    assert status == 200
    assert json.loads(content) == json.loads(GOOD)
    assert parsed == ["Order"]
    with pytest.raises(AssertionError, match="FastAPI's own"):  # a bad body goes its way
        call(app, BAD[0])


def test_the_openapi_document_is_fastapis() -> None:
    assert make_app(True, []).openapi() == make_app(False, []).openapi()


def test_a_route_with_more_than_its_body_is_refused() -> None:
    app = FastAPI()

    def dependency() -> None:
        return None

    async def with_dependency(body: Order) -> Response:
        return Response()

    async def with_query(body: Order, page: int = 0) -> Response:
        return Response()

    def not_async(body: Order) -> Response:
        return Response()

    for endpoint, extra in (
        (with_dependency, {"dependencies": [Depends(dependency)]}),
        (with_query, {}),
        (not_async, {}),
    ):
        with pytest.raises(TypeError, match="one body model"):
            app.router.add_api_route(
                "/x", endpoint, methods=["POST"], route_class_override=JSONBodyRoute, **extra
            )
