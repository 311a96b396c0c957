"""A FastAPI route whose JSON body pydantic-core parses and validates in one step.

FastAPI's own handler reads a JSON body with `json.loads`, then validates the Python
objects, after resolving the route's parameters one by one: for `POST /v1/placements` with
1,000 candidates about a fifth of the server's time for the request (docs/benchmarks.md,
"Where the time goes"). This route does the same with `model_validate_json` on the raw
bytes and calls the endpoint with the model, for a route whose only parameter is its body
model and which has no dependencies.

Only the well-formed request takes that path. Anything else goes FastAPI's own way, the
route's usual handler, so that what a caller sees is what FastAPI answers: another content
type, a body that does not parse or validate (the same 422, naming the field, from the same
exception handler). The route's OpenAPI document is FastAPI's: the route is an APIRoute
with the same parameters. A body's size is limited before either reads it
(decider.api.body_limit, in the capped `receive` both read through).

Public, long-standing APIs only: `APIRoute.get_route_handler` (FastAPI's documented way to
customise a route), the route's `endpoint`, `path` and `dependencies`, the endpoint's
signature read with `inspect`, and Starlette's `Request.body()`, which keeps the body it
read for the usual handler to read again.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response


class JSONBodyRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        usual = super().get_route_handler()
        endpoint = self.endpoint
        parameters = list(inspect.signature(endpoint).parameters.values())
        model = (
            typing.get_type_hints(endpoint).get(parameters[0].name)
            if len(parameters) == 1
            else None
        )
        plain = (
            inspect.iscoroutinefunction(endpoint)
            and isinstance(model, type)
            and issubclass(model, BaseModel)
            and parameters[0].default is inspect.Parameter.empty
            and not self.dependencies
            and "{" not in self.path
        )
        if not plain:
            raise TypeError(f"{self.path}: JSONBodyRoute takes one body model and nothing else")
        assert isinstance(model, type) and issubclass(model, BaseModel)
        name = parameters[0].name
        validate = model.model_validate_json

        async def handler(request: Request) -> Response:
            if request.headers.get("content-type") != "application/json":
                return await usual(request)
            try:
                value = validate(await request.body())
            except ValidationError:
                return await usual(request)  # the body is kept: it is read once
            response = await endpoint(**{name: value})
            if not isinstance(response, Response):  # as FastAPI would, it says what went wrong
                raise TypeError(f"{self.path}: the endpoint must return a Response")
            return response

        return handler
