"""agent.yaml: where the node is, what it declares, and which sources it polls.

```yaml
node: gpu-r12-07-03              # default: the host name
labels:
  llmgw.io/site: sto1
  llmgw.io/room: hall-b
  llmgw.io/row: "12"
  llmgw.io/rack: r12-07
  llmgw.io/pdu: r12-07-a,r12-07-b  # both feeds of a dual-fed rack
overhead_watts: 250              # fans, disks, PSU loss: what no sensor sees
bmc_includes_gpus: true          # the BMC's node power includes the GPUs' draw
listen: ":9850"
sources:                         # every source is on by default
  gpu:   {enabled: true, interval: 5s, library: null}
  hwmon: {enabled: true, interval: 5s}
  rapl:  {enabled: true, interval: 5s}
  ipmi:  {enabled: true, interval: 30s, timeout: 10s}   # BMCs: at least 30s
  redfish: {url: "https://10.20.7.3", credentials_file: /etc/llmgw/bmc-credentials}
  cray:  {enabled: true, interval: 5s}
  hwmon_power: {enabled: true, interval: 5s}
  units: {glob: "kubepods.slice/*/*", pattern: '(?P<unit>[^/]+)$'}  # off until glob is set
```

Every source also takes `deadline` (how long one poll may take before it is
abandoned and the source reads down, `hung`; default: the source's
`default_deadline`) and `stale_after` (how old its last reading may grow before
its series are no longer served; default 3 × interval): docs/exporter.md.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from exporter.sources import SOURCES
from exporter.sources.base import SourceConfig
from llmgw_common.yamlfile import load_model

DEFAULT_PORT = 9850

# One typed section per registered source, so a misspelt source or key is
# refused with its line, and each source's own keys are checked.
Sources: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "Sources",
    __config__=ConfigDict(extra="forbid", frozen=True),
    **{name: (cls.Config, cls.Config()) for name, cls in SOURCES.items()},
)


class Labels(BaseModel):
    """The well-known `llmgw.io/*` keys; any other key is refused as a likely typo."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    site: str = Field("", alias="llmgw.io/site")
    room: str = Field("", alias="llmgw.io/room")
    row: str = Field("", alias="llmgw.io/row")
    rack: str = Field("", alias="llmgw.io/rack")
    pdu: str = Field("", alias="llmgw.io/pdu")

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_names(cls, data: Any) -> Any:
        # YAML reads `llmgw.io/row: 12` as an int; a row's name is text either way.
        if isinstance(data, dict):
            return {
                key: str(value) if type(value) in (int, float) else value
                for key, value in data.items()
            }
        return data

    @property
    def pdus(self) -> list[str]:
        """One entry per feed: `a,b` names both feeds of a dual-fed node."""
        return [feed.strip() for feed in self.pdu.split(",") if feed.strip()]


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    node: str = Field(default_factory=socket.gethostname, min_length=1)
    labels: Labels = Labels()
    # Strict: a quoted "250" or `true` is a typo to refuse, not a number to guess.
    overhead_watts: float | None = Field(None, ge=0, le=100_000, strict=True)
    #: Whether the node's BMC (ipmi, redfish) or hwmon meter reading includes the GPUs.
    bmc_includes_gpus: bool | None = Field(None, strict=True)
    listen: str = f":{DEFAULT_PORT}"
    sources: Sources = Sources()  # type: ignore[valid-type]

    @field_validator("listen")
    @classmethod
    def _listen_parses(cls, listen: str) -> str:
        _, colon, port = listen.rpartition(":")
        if not colon or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"{listen!r} is not HOST:PORT or :PORT ([::]:PORT for IPv6)")
        return listen

    def source(self, name: str) -> SourceConfig:
        config: SourceConfig = getattr(self.sources, name)
        return config

    def interval(self, name: str) -> float:
        return self.source(name).interval or SOURCES[name].default_interval

    @property
    def listen_address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "0.0.0.0", int(port)


def load(path: Path | None) -> AgentConfig:
    """agent.yaml, or the defaults when no file is given. Raises yamlfile.ConfigError."""
    return AgentConfig() if path is None else load_model(path, AgentConfig)
