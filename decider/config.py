"""The decider's own configuration, `decider.yaml` (docs/decider.md).

```yaml
prometheus:
  url: http://127.0.0.1:9090   # Prometheus, Thanos Query, Mimir or VictoriaMetrics
  timeout: 2s                   # per query
  retries: 1                    # per query, on a connection error or a 5xx
  # As Prometheus' own http_config, secrets from files only (at most one of the two):
  # basic_auth: {username: decider, password_file: prometheus.password}
  # authorization: {type: Bearer, credentials_file: prometheus.token}
  # tls_config: {ca_file: ca.pem, cert_file: client.pem, key_file: client.key,
  #              insecure_skip_verify: false}
facility: facility.yaml         # relative paths are relative to this file
listen: 127.0.0.1:9851
database: decider.db            # reservations and holds (SQLite)
token_file: decider.token       # the bearer token of mutating calls
refresh_interval: 15s
reservation_ttl: 5m             # an unconfirmed reservation is dropped after this
staleness:
  readings: 2m                  # measured power, conditions, reading ages
  inventory: 1h                 # membership, GPU counts, GPU power limits
```

A bad file is refused whole with every problem's line (`llmgw_common.yamlfile.load_model`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmgw_common.yamlfile import Duration, FilePath, load_model

DEFAULT_PORT = 9851


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def credentials_in_url(url: str) -> bool:
    """Whether `url` carries a user or password (`https://user:secret@host`)."""
    parsed = urlparse(url)
    return parsed.username is not None or parsed.password is not None


def _refuse_inline_secret(data: object, field: str, use: str) -> None:
    """Prometheus' http_config also takes a secret inline; here it must come from a file,
    so that decider.yaml can be shown, diffed and checked in without it."""
    if isinstance(data, dict) and field in data:
        raise ValueError(
            f"`{field}` is not read from decider.yaml: put it in a file, name it in {use}"
        )


class BasicAuthSettings(_Model):
    """HTTP basic authentication: the password is the first line of `password_file`."""

    username: str = Field(min_length=1)
    password_file: FilePath

    @model_validator(mode="before")
    @classmethod
    def _password_from_a_file(cls, data: object) -> object:
        _refuse_inline_secret(data, "password", "prometheus.basic_auth.password_file")
        return data


class AuthorizationSettings(_Model):
    """An Authorization header `type credentials`, the credentials read from a file."""

    type: str = Field("Bearer", pattern=r"^[A-Za-z][A-Za-z0-9_-]*$")
    credentials_file: FilePath

    @model_validator(mode="before")
    @classmethod
    def _credentials_from_a_file(cls, data: object) -> object:
        _refuse_inline_secret(data, "credentials", "prometheus.authorization.credentials_file")
        return data


class TLSSettings(_Model):
    """TLS to an https:// Prometheus: a CA to trust (else the system's), a client
    certificate and key, or no verification at all (`insecure_skip_verify`, for tests)."""

    ca_file: FilePath | None = None
    cert_file: FilePath | None = None
    key_file: FilePath | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _certificate_with_key(self) -> TLSSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: a client certificate needs both")
        return self


class PrometheusSettings(_Model):
    """Where Prometheus is and how to reach it: `basic_auth`, `authorization` and
    `tls_config` as in Prometheus' own http_config, secrets read from files only."""

    url: str = "http://127.0.0.1:9090"
    timeout: Duration = 2.0
    retries: int = Field(1, ge=0, le=5, strict=True)  # "1" or true is a typo, not 1
    basic_auth: BasicAuthSettings | None = None
    authorization: AuthorizationSettings | None = None
    tls_config: TLSSettings | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parsed = urlparse(url)
        if credentials_in_url(url):
            # The message must not repeat the URL: it holds the secret.
            raise ValueError(
                "the URL carries a user and password, which would be shown wherever the URL "
                "is (logs, /readyz, errors): give the user in prometheus.basic_auth.username "
                "and the password in a file named by prometheus.basic_auth.password_file"
            )
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        if parsed.query or parsed.fragment:
            raise ValueError(
                "the URL has a query string or fragment, which no query would carry: give "
                "Prometheus' base URL (a path prefix such as /prometheus is kept)"
            )
        return url.rstrip("/")

    @model_validator(mode="after")
    def _one_authorization(self) -> PrometheusSettings:
        if self.basic_auth is not None and self.authorization is not None:
            raise ValueError("basic_auth and authorization are exclusive: give one of them")
        return self

    def relative_to(self, directory: Path) -> PrometheusSettings:
        """Its files' relative paths resolved against `directory` (the config file's)."""

        def resolve(path: Path | None) -> Path | None:
            return path if path is None or path.is_absolute() else directory / path

        updates: dict[str, object] = {}
        if self.basic_auth is not None:
            password_file = resolve(self.basic_auth.password_file)
            updates["basic_auth"] = self.basic_auth.model_copy(
                update={"password_file": password_file}
            )
        if self.authorization is not None:
            credentials_file = resolve(self.authorization.credentials_file)
            updates["authorization"] = self.authorization.model_copy(
                update={"credentials_file": credentials_file}
            )
        if self.tls_config is not None:
            tls = self.tls_config
            updates["tls_config"] = tls.model_copy(
                update={
                    name: resolve(getattr(tls, name))
                    for name in ("ca_file", "cert_file", "key_file")
                }
            )
        return self.model_copy(update=updates)


class Staleness(_Model):
    """How long a part of the snapshot stays usable after its last successful read."""

    readings: Duration = 120.0
    inventory: Duration = 3600.0


class DeciderConfig(_Model):
    prometheus: PrometheusSettings = PrometheusSettings()
    facility: FilePath = Path("facility.yaml")
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    database: FilePath = Path("decider.db")
    token_file: FilePath | None = None
    refresh_interval: Duration = 15.0
    reservation_ttl: Duration = 300.0
    staleness: Staleness = Staleness()
    #: Answer placements from the answer cache (decider.placement.answers); false: from the
    #: rules directly, every candidate judged at each request (the same answers, slower on
    #: a large site: for ruling the cache out).
    placement_cache: bool = True

    @field_validator("listen")
    @classmethod
    def _host_port(cls, listen: str) -> str:
        _host, port = split_listen(listen)
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is out of range")
        return listen

    @model_validator(mode="after")
    def _refresh_within_staleness(self) -> DeciderConfig:
        if self.refresh_interval >= self.staleness.readings:
            raise ValueError(
                f"refresh_interval {self.refresh_interval:g}s must be shorter than "
                f"staleness.readings {self.staleness.readings:g}s, or every reading is stale "
                "before it is refreshed"
            )
        return self

    def relative_to(self, directory: Path) -> DeciderConfig:
        """Relative paths resolved against `directory` (the config file's)."""

        def resolve(path: Path | None) -> Path | None:
            return None if path is None or path.is_absolute() else directory / path

        updates: dict[str, object] = {
            name: resolved
            for name in ("facility", "database", "token_file")
            if (resolved := resolve(getattr(self, name))) is not None
        }
        updates["prometheus"] = self.prometheus.relative_to(directory)
        return self.model_copy(update=updates)


def split_listen(listen: str) -> tuple[str, int]:
    """`host:port` (`[::1]:port` for IPv6; an empty host is 127.0.0.1) → (host, port)."""
    host, colon, port = listen.rpartition(":")
    if not colon or not port.isdigit():
        raise ValueError(f"{listen!r} is not host:port")
    host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
    return host, int(port)


def load(path: Path) -> DeciderConfig:
    """Read decider.yaml; raises ConfigError listing every problem as `path:line: field: reason`."""
    return load_model(path, DeciderConfig).relative_to(path.parent)
