"""The decider's HTTP API as the CLI calls it: where the decider is, its token, JSON in and
out, and every failure as one line with its exit status (llmgw_facility.exit_status)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from decider.facility import DomainRef
from llmgw_facility.exit_status import EXIT_BAD_FILE, EXIT_REFUSED, EXIT_UNREACHABLE

DEFAULT_DECIDER_URL = "http://127.0.0.1:9851"
URL_ENV = "LLMGW_DECIDER_URL"
TOKEN_ENV = "LLMGW_DECIDER_TOKEN_FILE"
DEFAULT_TIMEOUT_S = 10.0


class CallFailed(Exception):
    """A call to the decider that got no usable answer; the message is one line."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _os_reason(exc: BaseException) -> str | None:
    """The operating system's words under a requests error ("Connection refused"), if any."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        strerror = getattr(current, "strerror", None)
        if isinstance(strerror, str) and strerror:
            return strerror
        reason = getattr(current, "reason", None)
        stack.extend(arg for arg in current.args if isinstance(arg, BaseException))
        if isinstance(reason, BaseException):
            stack.append(reason)
        stack.extend((current.__cause__, current.__context__))
    return None


class Decider:
    """The decider's HTTP API as the CLI calls it: JSON in and out, every failure one line."""

    def __init__(self, url: str, token_file: Path | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self.timeout = timeout

    def _token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CallFailed(
                f"cannot read the token file {self.token_file}: {exc}", EXIT_BAD_FILE
            ) from exc
        if not token:
            raise CallFailed(f"the token file {self.token_file} is empty", EXIT_BAD_FILE)
        token = token.splitlines()[0].strip()
        if not token.isascii() or not token.isprintable():
            raise CallFailed(
                f"the token in {self.token_file} is not printable ASCII: an HTTP header "
                "cannot carry it",
                EXIT_BAD_FILE,
            )
        return token

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        mutating: bool = False,
    ) -> Any:
        """The answer's JSON; raises CallFailed with the decider's own words on an error."""
        headers = {"Accept": "application/json"}
        token = self._token() if mutating else None
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        where = f"the decider at {self.url}"
        try:
            response = requests.request(
                method,
                self.url + path,
                json=body,
                params=params,
                headers=headers,
                timeout=self.timeout,
            )
        except requests.Timeout as exc:
            raise CallFailed(
                f"no answer from {where} within {self.timeout:g}s", EXIT_UNREACHABLE
            ) from exc
        except requests.ConnectionError as exc:
            why = _os_reason(exc) or "the connection failed"
            raise CallFailed(
                f"cannot reach {where}: {why} (is llmgw-decider running there? set the "
                f"address with --decider URL or ${URL_ENV})",
                EXIT_UNREACHABLE,
            ) from exc
        except requests.RequestException as exc:
            raise CallFailed(f"cannot call {where}: {exc}", EXIT_UNREACHABLE) from exc
        try:
            answer = response.json() if response.content else None
        except ValueError:
            answer = None
            if response.ok:
                kind = response.headers.get("Content-Type", "no content type")
                raise CallFailed(
                    f"{self.url}{path} answered HTTP {response.status_code} with {kind}, not "
                    f"JSON: is {self.url} the decider?",
                    EXIT_UNREACHABLE,
                ) from None
        if response.ok:
            return answer
        raise CallFailed(self._describe(response, answer))

    def _describe(self, response: requests.Response, answer: Any) -> str:
        status = f"HTTP {response.status_code}"
        detail = answer.get("detail") if isinstance(answer, dict) else None
        if not isinstance(detail, str):
            text = " ".join(response.text.split())[:200]
            detail = text or response.reason or "no detail"
        if response.status_code == 401:
            if self.token_file is None:
                hint = f"give the decider's token with --token-file FILE or ${TOKEN_ENV}"
            else:
                hint = f"the token in {self.token_file} is not the decider's"
            return f"the decider refused the call ({status}): {hint}"
        return f"the decider answered {status}: {detail}"


def domain_path(ref: DomainRef) -> str:
    return f"/v1/domains/{quote(ref.kind, safe='')}/{quote(ref.name, safe='')}"
