"""What the cost model assumes of a lab's links: their rate, the share of it that carries
payload, and the latencies a transfer pays before its first byte."""

from __future__ import annotations

from dataclasses import dataclass

# Bytes around every full-sized TCP segment's payload that HTB counts: IPv4 (20) + TCP (20)
# + the timestamp option Linux sends (12) inside the MTU, and the Ethernet header (14)
# outside it (HTB shapes skb->len at a veth's egress: no preamble, FCS or gap).
TCP_IP_HEADERS = 52
ETHERNET_HEADER = 14


def tcp_efficiency(mtu: int) -> float:
    """Payload bytes per shaped byte for a bulk TCP stream: (mtu − 52)/(mtu + 14), 0.9564 at
    MTU 1500: what iperf3 measured through the lab's 100 Mbit HTB links (REFERENCE §5:
    95.6 %). gRPC's framing (a 9-byte HTTP/2 header per ≤1 MiB frame, ~30 bytes of Chunk
    header per 512 KiB message) costs under 0.01 % more and is left out."""
    return (mtu - TCP_IP_HEADERS) / (mtu + ETHERNET_HEADER)


# RoCE v2 (soft-RoCE): a packet's payload is the path MTU, the largest InfiniBand MTU that
# fits the netdev's MTU less rxe's header allowance (1024 at MTU 1500, 4096 at 9000), inside
# Ethernet (14) + IPv4 (20) + UDP (8) + the base transport header (12) + its CRC (4).
IB_MTUS = (256, 512, 1024, 2048, 4096)
RXE_HEADER_ALLOWANCE = 80  # what rxe subtracts from the netdev's MTU before choosing (rxe_param.h)
ROCE_HEADERS = 14 + 20 + 8 + 12 + 4


def roce_mtu(mtu: int) -> int:
    """RoCE's path MTU on a netdev of `mtu` bytes, as rxe chooses it."""
    fitting = [m for m in IB_MTUS if m <= mtu - RXE_HEADER_ALLOWANCE]
    return fitting[-1] if fitting else IB_MTUS[0]


def roce_efficiency(mtu: int) -> float:
    """Payload bytes per shaped byte for RoCE v2 SENDs: 1024/1082 = 0.9464 at MTU 1500."""
    payload = roce_mtu(mtu)
    return payload / (payload + ROCE_HEADERS)


# what a transport's bytes look like on the wire, by the name its registration gives
WIRES = {"tcp": tcp_efficiency, "roce": roce_efficiency}


@dataclass(frozen=True)
class Network:
    """Every link direction carries `bandwidth` bits/s, of which `efficiency` is payload.

    latency: α, seconds the agents spend on a message before its bytes flow (software),
             measured per lab and transport (experiment/calibrate.py: `testbed calibrate`,
             or a run before its first point).
    cores:   the CPU cores every agent shares (one machine's), or None: a core per agent.
             A rank's j-th message of a step waits (j + 1)·α × max(1, senders / cores).
    peer_latency: what each message of a rank costs beyond α per further peer the rank
             exchanges with over the run (its threads and sockets contend): its α is
             latency + peer_latency × (peers − 2), α being a ring's (two peers: the one it
             sends to, the one it hears from); measured with a zero-byte mesh beside the
             zero-byte ring that gives α.
    delay:   one-way seconds per link (netem's delay): a transfer also waits its path's delay.
    """

    bandwidth: float
    efficiency: float = tcp_efficiency(1500)
    latency: float = 0.0
    delay: float = 0.0
    mtu: int = 1500
    cores: int | None = None
    peer_latency: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"link bandwidth must be positive, got {self.bandwidth}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency must lie in (0, 1], got {self.efficiency}")
        if self.latency < 0 or self.delay < 0 or self.peer_latency < 0:
            raise ValueError("latency, peer_latency and delay must not be negative")
        if self.cores is not None and self.cores < 1:
            raise ValueError(f"cores must be at least 1, got {self.cores}")

    @property
    def payload_rate(self) -> float:
        """Payload bytes per second of one link direction."""
        return self.bandwidth / 8 * self.efficiency

    @classmethod
    def from_links(cls, links, efficiency: float | None = None, latency: float = 0.0,
                   cores: int | None = None, wire: str = "tcp", peer_latency: float = 0.0) -> "Network":
        """From a lab's `links` (anything with bandwidth in bits/s, delay in seconds, mtu):
        efficiency by default from the MTU and the transport's `wire` (WIRES: tcp, roce)."""
        return cls(
            bandwidth=float(links.bandwidth),
            efficiency=WIRES[wire](links.mtu) if efficiency is None else efficiency,
            latency=latency,
            delay=float(links.delay),
            mtu=int(links.mtu),
            cores=cores,
            peer_latency=peer_latency,
        )
