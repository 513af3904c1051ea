"""A hosts file: the machines a lab may be spread over (issue 31), as `testbed topology LAB
--hosts FILE` reads it:

    scheduler: 192.168.50.10            # optional: this machine's address the hosts reach
    hosts:
      - {name: rack1, address: 192.168.50.11, nic: 10Gbit, mtu: 9000}
      - {name: rack2, address: 192.168.50.12, nic: 10Gbit, mtu: 9000}

`address` is the host's underlay address (where its VXLAN wires end); `nic` its underlay
NIC's rate, when known, so that what crosses between hosts is checked against it; `mtu` the
underlay's, which must carry the lab's MTU plus VXLAN's 50 bytes. `testbed hosts up` reaches
a host over SSH as root at its address, or, with `netns: NAME`, enters that named network
namespace of this machine (a host faked on one machine: it keeps its state and its lab
namespaces' names apart); `python` is the host's interpreter with testbed installed
(default: this machine's, at the same path). Without `scheduler`, the scheduler listens on
this machine's address towards the first host.
"""

from __future__ import annotations

import ipaddress

from pydantic import Field, model_validator

from orchestrator.spec.lab import MAX_MTU, MIN_MTU, Rate, _Strict
from orchestrator.topology.partition import Host

MAX_HOSTS = 64
HostName = Field(pattern=r"^[a-z][a-z0-9-]{0,31}$", description="lower-case letters, digits and '-', e.g. rack1")


class HostSpec(_Strict):
    name: str = HostName
    address: ipaddress.IPv4Address
    nic: Rate | None = None
    mtu: int = Field(1500, strict=True, ge=MIN_MTU, le=MAX_MTU, description="the underlay's, bytes")
    netns: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                              description="a named network namespace of this machine standing in for the host")
    python: str | None = Field(None, pattern=r"^/[^\s'\"$`\\]{1,255}$",
                               description="absolute path of the host's python with testbed installed")

    def host(self) -> Host:
        return Host(self.name, None if self.nic is None else float(self.nic), self.mtu)


class HostsSpec(_Strict):
    scheduler: ipaddress.IPv4Address | None = None
    hosts: tuple[HostSpec, ...] = Field(min_length=1, max_length=MAX_HOSTS)

    @model_validator(mode="after")
    def _distinct(self) -> "HostsSpec":
        for field in ("name", "address", "netns"):
            seen: dict = {}
            for index, host in enumerate(self.hosts):
                value = getattr(host, field)
                if value is None:
                    continue
                if value in seen:
                    raise ValueError(f"hosts.{index}.{field}: {value} is host {seen[value]}'s already: give each host "
                                     f"its own {field}")
                seen[value] = index
        return self
