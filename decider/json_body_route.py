"""A FastAPI route whose JSON body pydantic-core parses and validates in one step.

FastAPI's own handler reads a JSON body with `json.loads`, then validates the Python
objects, after resolving the route's parameters one by one: for `POST /v1/placements` with
1,000 candidates about a fifth of the server's time for the request (docs/benchmarks.md,
"Where the time goes"). This route does the same with `model_validate_json` on the raw
bytes and calls the endpoint with the model, for a route whose only parameter is its body
model and which has no dependencies.

Only the well-formed request takes that path. Anything else goes FastAPI's own way, the
route's usual handler, so that what a caller sees is what FastAPI answers: another content
type, a request-body limit in force, a body that does not parse or validate (the same 422,
naming the field, from the same exception handler). The route's OpenAPI document is
FastAPI's: the route is an APIRoute with the same parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY
from starlette.requests import Request
from starlette.responses import Response


class JSONBodyRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        usual = super().get_route_handler()
        dependant, body_field = self.dependant, self.body_field
        model = None if body_field is None else body_field.field_info.annotation
        plain = (
            inspect.iscoroutinefunction(self.endpoint)
            and isinstance(model, type)
            and issubclass(model, BaseModel)
            and len(dependant.body_params) == 1
            and not dependant.dependencies
            and not (dependant.path_params or dependant.query_params)
            and not (dependant.header_params or dependant.cookie_params)
            and dependant.request_param_name is None
            and dependant.background_tasks_param_name is None
            and dependant.response_param_name is None
        )
        if not plain:
            raise TypeError(f"{self.path}: JSONBodyRoute takes one body model and nothing else")
        assert isinstance(model, type) and issubclass(model, BaseModel)
        name = dependant.body_params[0].name
        endpoint = self.endpoint
        validate = model.model_validate_json

        async def handler(request: Request) -> Response:
            if (
                request.headers.get("content-type") != "application/json"
                or MAX_BODY_SIZE_SCOPE_KEY in request.scope
            ):
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
