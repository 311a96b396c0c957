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
capping:                         # the capping agent (docs/exporter.md); off by default
  enabled: true
  decider_url: http://decider.llmgw:9860
  token_file: /etc/llmgw/decider-token
  state_file: /var/lib/llmgw-exporter/capping.json
```

Every source also takes `deadline` (how long one poll may take before it is
abandoned and the source reads down, `hung`; default: the source's
`default_deadline`) and `stale_after` (how old its last reading may grow before
its series are no longer served; default 3 × interval): docs/exporter.md.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from exporter.sources import SOURCES
from exporter.sources.base import SourceConfig
from exporter.sources.ipmi import IpmiConfig
from exporter.sources.redfish import RedfishConfig
from llmgw_common.yamlfile import ConfigError, Duration, FilePath, load_model

DEFAULT_PORT = 9850

# Every model here is `defer_build`, as the sources' sections are (exporter/sources/base.py),
# and a nested section's default is `{}` validated by the model holding it, not an instance
# built at import (which would build the section's own validator): agent.yaml is checked by
# one validator, not by one more per model nested in it (docs/benchmarks.md, "Where the
# memory goes"). A model used alone (a test's `GpuConfig(...)`) builds its own when first used.

# One typed section per registered source, so a misspelt source or key is
# refused with its line, and each source's own keys are checked.
Sources: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "Sources",
    __config__=ConfigDict(extra="forbid", frozen=True, defer_build=True),
    **{
        name: (cls.Config, Field(default_factory=dict, validate_default=True))
        for name, cls in SOURCES.items()
    },
)


class Labels(BaseModel):
    """The well-known `llmgw.io/*` keys; any other key is refused as a likely typo."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

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


class BmcTarget(BaseModel):
    """One BMC of `bmcs`, read when Prometheus probes it (`/bmc?target=NODE`,
    exporter/bmc_probe.py): its node's `labels` and `bmc_includes_gpus`, and its BMC's
    out-of-band section, `ipmi` (with `host`) or `redfish` (with `url`): the keys of
    `sources.ipmi` / `sources.redfish`, checked by the same models."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    labels: Labels = Field(default_factory=dict, validate_default=True)
    bmc_includes_gpus: bool | None = Field(None, strict=True)
    ipmi: IpmiConfig | None = None
    redfish: RedfishConfig | None = None

    @model_validator(mode="after")
    def _one_bmc_read_out_of_band(self) -> BmcTarget:
        if (self.ipmi is None) == (self.redfish is None):
            raise ValueError("set one of ipmi (with host) or redfish (with url): the BMC's way in")
        if self.ipmi is not None and self.ipmi.host is None:
            raise ValueError("ipmi needs host: a BMC target is read over the LAN, not in-band")
        if self.redfish is not None and self.redfish.url is None:
            raise ValueError("redfish needs url: the BMC's address")
        if not self.source[1].enabled:
            raise ValueError("a BMC target is read whenever it is probed: remove it instead")
        return self

    @property
    def source(self) -> tuple[str, IpmiConfig | RedfishConfig]:
        """(the source's name, its section)."""
        if self.ipmi is not None:
            return "ipmi", self.ipmi
        assert self.redfish is not None  # the validator says one of them is set
        return "redfish", self.redfish


#: The BMCs one exporter reads on request, by node name (the `node` of their series).
BmcTargets = dict[Annotated[str, Field(min_length=1)], BmcTarget]


class BmcTargetsFile(BaseModel):
    """A file that `bmcs_file` names: the same `bmcs:` section, in a file of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    bmcs: BmcTargets


class CappingConfig(BaseModel):
    """`capping`: the agent that applies the decider's GPU power limits (exporter/capping.py).

    Off by default: a node applies limits only where agent.yaml turns it on.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    enabled: bool = False
    #: The decider's base URL, `http(s)://host:port`.
    decider_url: str | None = None
    #: The decider's bearer token (its `token_file`): one line, read at every request.
    token_file: FilePath | None = None
    #: Where the agent keeps its last lease and which GPUs it capped (written atomically).
    state_file: FilePath = Path("/var/lib/llmgw-exporter/capping.json")
    #: How long one lease request may take, connection to last byte, before it is a failure.
    timeout: Duration = 10.0
    #: How long setting the GPUs' limits may take before NVML is taken for stuck.
    nvml_deadline: Duration = 10.0
    #: Between two requests while the agent holds no lease (with one: lease_seconds / 3).
    retry: Duration = 10.0

    @field_validator("decider_url")
    @classmethod
    def _url_is_http(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url.rstrip("/") if url is not None else None

    @model_validator(mode="after")
    def _enabled_needs_a_decider(self) -> CappingConfig:
        if self.enabled:
            missing = [key for key in ("decider_url", "token_file") if getattr(self, key) is None]
            if missing:
                raise ValueError(f"capping is enabled but {' and '.join(missing)} not set")
        return self


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    node: str = Field(default_factory=socket.gethostname, min_length=1)
    labels: Labels = Field(default_factory=dict, validate_default=True)
    # Strict: a quoted "250" or `true` is a typo to refuse, not a number to guess.
    overhead_watts: float | None = Field(None, ge=0, le=100_000, strict=True)
    #: Whether the node's BMC (ipmi, redfish) or hwmon meter reading includes the GPUs.
    bmc_includes_gpus: bool | None = Field(None, strict=True)
    listen: str = f":{DEFAULT_PORT}"
    sources: Sources = Field(default_factory=dict, validate_default=True)  # type: ignore[valid-type]
    #: BMCs read out-of-band on request, one Prometheus target each (exporter/bmc_probe.py),
    #: listed here or in `bmcs_file` (a file holding a `bmcs:` section), not both.
    bmcs: BmcTargets = Field(default_factory=dict)
    bmcs_file: FilePath | None = None
    capping: CappingConfig = Field(default_factory=dict, validate_default=True)

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
    if path is None:
        return AgentConfig()
    config = load_model(path, AgentConfig)
    if config.bmcs_file is not None:  # relative to agent.yaml's folder
        if config.bmcs:
            raise ConfigError(path, ["1: bmcs: list the BMCs here or in bmcs_file, not both"])
        listed = load_model(path.parent / config.bmcs_file, BmcTargetsFile).bmcs
        config = config.model_copy(update={"bmcs": listed})
    return config
