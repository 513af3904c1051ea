"""Address plans: structured subnets that people can read, packed ones when they must.

A topology names each L2 segment by a small key (pod, edge) or (level, switch). When the pool
is large enough, each key part takes a whole octet, so a fat-tree host in a 10.0.0.0/8 pool
is 10.pod.switch.ID as in Al-Fares et al., and a BCube NIC is 10.level.switch.port. When it
is not, key parts take only the bits they need. When even that does not fit, the error says
which pool is too small and by how much.
"""

from __future__ import annotations

import ipaddress
import math

from orchestrator.errors import TopologyError


def bits_for(count: int) -> int:
    """Bits to number `count` distinct values (0 for a single one)."""
    return max(0, math.ceil(math.log2(count))) if count > 1 else 0


class StructuredPool:
    """Subnets of one prefix length indexed by a key tuple, carved from `pool`."""

    def __init__(
        self,
        pool: ipaddress.IPv4Network,
        dims: list[int],
        host_bits: int,
        field: str,
        what: str,
        min_host_bits: int | None = None,
    ) -> None:
        """`host_bits` is preferred (a /24 LAN reads well); `min_host_bits` is the fallback."""
        self.pool = pool
        self.dims = dims
        available = 32 - pool.prefixlen
        readable_space = 8 * len(dims) + max(8, host_bits)
        if all(d <= 256 for d in dims) and readable_space <= available:
            self.widths, self.space, self.host_bits = [8] * len(dims), max(8, host_bits), host_bits
            return
        self.widths = [bits_for(d) for d in dims]
        for bits in (host_bits, min_host_bits if min_host_bits is not None else host_bits):
            if sum(self.widths) + bits <= available:
                self.space = self.host_bits = bits
                return
        needed = sum(self.widths) + (min_host_bits if min_host_bits is not None else host_bits)
        raise TopologyError(
            f"{field} {pool} is too small for {what}: it needs a /{32 - needed} or larger"
        )

    def subnet(self, *key: int) -> ipaddress.IPv4Network:
        offset = 0
        for value, dim, width in zip(key, self.dims, self.widths, strict=True):
            if not 0 <= value < dim:
                raise ValueError(f"key part {value} outside 0..{dim - 1}")
            offset = (offset << width) | value
        base = int(self.pool.network_address) + (offset << self.space)
        return ipaddress.IPv4Network((base, 32 - self.host_bits))

    def aggregate(self, *key: int) -> ipaddress.IPv4Network:
        """The prefix covering every subnet whose key starts with `key`."""
        offset, used = 0, 0
        for value, width in zip(key, self.widths):
            offset = (offset << width) | value
            used += width
        rest = sum(self.widths) - used + self.space
        base = int(self.pool.network_address) + (offset << rest)
        return ipaddress.IPv4Network((base, 32 - rest))

    @staticmethod
    def host(subnet: ipaddress.IPv4Network, index: int) -> ipaddress.IPv4Interface:
        """The `index`-th address of `subnet` (1 = first usable) with the subnet's mask."""
        if not 0 < index < subnet.num_addresses - (subnet.prefixlen < 31):
            raise TopologyError(f"host {index} does not fit in {subnet}")
        return ipaddress.IPv4Interface((int(subnet.network_address) + index, subnet.prefixlen))


class LinkPool:
    """Consecutive /31 point-to-point subnets for router-to-router links."""

    def __init__(self, pool: ipaddress.IPv4Network, needed: int, field: str) -> None:
        capacity = pool.num_addresses // 2
        if needed > capacity:
            raise TopologyError(
                f"{field} {pool} holds {capacity} /31 links, this topology needs {needed}: "
                f"use a /{32 - bits_for(needed) - 1} or larger"
            )
        self.pool = pool
        self.next = 0

    def allocate(self) -> tuple[ipaddress.IPv4Interface, ipaddress.IPv4Interface]:
        base = int(self.pool.network_address) + 2 * self.next
        self.next += 1
        return (
            ipaddress.IPv4Interface((base, 31)),
            ipaddress.IPv4Interface((base + 1, 31)),
        )


def lan_host_bits(hosts: int) -> tuple[int, int]:
    """(preferred, minimal) host bits for a LAN of `hosts` addresses: a /24 when it fits."""
    minimal = bits_for(hosts + 2)
    return max(8, minimal), minimal
