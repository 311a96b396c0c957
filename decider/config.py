"""The decider's own configuration, `decider.yaml` (docs/decider.md).

```yaml
prometheus:
  url: http://127.0.0.1:9090   # Prometheus, Thanos Query, Mimir or VictoriaMetrics
  timeout: 2s                   # per query
  retries: 1                    # per query, on a connection error or a 5xx
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

from llmgw_common.yamlfile import Duration, load_model

DEFAULT_PORT = 9851


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PrometheusSettings(_Model):
    url: str = "http://127.0.0.1:9090"
    timeout: Duration = 2.0
    retries: int = Field(1, ge=0, le=5)

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url.rstrip("/")


class Staleness(_Model):
    """How long a part of the snapshot stays usable after its last successful read."""

    readings: Duration = 120.0
    inventory: Duration = 3600.0


class DeciderConfig(_Model):
    prometheus: PrometheusSettings = PrometheusSettings()
    facility: Path = Path("facility.yaml")
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    database: Path = Path("decider.db")
    token_file: Path | None = None
    refresh_interval: Duration = 15.0
    reservation_ttl: Duration = 300.0
    staleness: Staleness = Staleness()

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

        updates = {
            name: resolved
            for name in ("facility", "database", "token_file")
            if (resolved := resolve(getattr(self, name))) is not None
        }
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
