"""How an agent's chunks travel between ranks: one table of transports, by name.

A transport is a `Sender` factory (agent/transports/base.py says what a sender and its
streams do) and, on the receiving side, whatever listener hands chunks to the engine. The
engine (agent/engine.py) keeps per-range ordering, pacing, credits and stall reporting; a
transport only moves one rank's chunks to a peer's address and says why it could not.

    grpc   gRPC Data.Push streams (HTTP/2): the reference path, any gRPC peer can speak it
    tcp    one plain TCP connection per (peer, NIC), read straight into the gradient buffer
           and written from it, every chunk by native threads (agent/native) where the
           library is built, else by threads and the event loop in Python
    rdma   RoCE v2 queue pairs per (peer, NIC) over soft-RoCE, through pyverbs and rdma_cm;
           paced by the agent, since rxe has no congestion control

A user's transport registers with `register(name, factory, port_offset, listener=…)` the way
these do; the agent serves every registered transport's listener on each data address.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

DEFAULT = "tcp"  # the fastest every lab supports (rdma needs a kernel with rxe)


@dataclass(frozen=True)
class Transport:
    name: str
    sender: Callable[..., object]  # (run_id, rank, window_bytes) → base.Sender
    port_offset: int  # its listening port on a data address: the address's port + this
    about: str = ""
    # messages in flight are held in user space (encoded, buffered, received): their size
    # is then budgeted by the streams a rank has (agent/plan.py, chunk_bytes)
    holds_messages: bool = False
    # bytes of a send the kernel takes before they leave: a rank's send is handed over, and
    # its next step may start, once no more than this waits (the cost model counts it)
    send_buffer: int = 0
    # listener(address, engine_for) → an object with bind(), async start() and close(): what
    # an agent serves on each data address (None: the transport's chunks arrive over gRPC Data)
    listener: Callable[..., object] | None = None
    # an address where its listener cannot bind (no RDMA device there) is served without it
    optional: bool = False
    # the sender paces itself (`pace(target, bytes_per_s)`): no kernel socket to pace, and
    # no congestion control of its own, so it is paced even with the link to itself
    paces_itself: bool = False
    # its bytes on the wire, for the model's payload share (cost.network.WIRES: tcp, roce)
    wire: str = "tcp"
    # pick_address([host:port, ...]) → the one to send to when a transfer names no NIC
    # (None: the peer's first address, which the kernel routes to whichever NIC it arrives on)
    pick_address: Callable[[list[str]], str] | None = None
    # engine(*Engine's arguments) → a rank's engine that moves the chunks itself, or None to
    # leave them to agent/engine.py (the tcp transport's native data path when it is built)
    engine: Callable[..., object] | None = None
    # a step's send waits for its receiver's word that it has entered the step (tcp's READY):
    # the cost model then starts such a transfer once its receiver has applied every earlier
    # step's receive (cost/simulate.py)
    rendezvous: bool = False


TRANSPORTS: dict[str, Transport] = {}


def register(name: str, sender: Callable[..., object], port_offset: int, about: str = "",
             holds_messages: bool = False, send_buffer: int = 0, listener: Callable[..., object] | None = None,
             optional: bool = False, paces_itself: bool = False, wire: str = "tcp",
             pick_address: Callable[[list[str]], str] | None = None,
             engine: Callable[..., object] | None = None, rendezvous: bool = False) -> None:
    """Add (or replace) the transport `name`: `sender(run_id, rank, window_bytes)` makes a
    rank's sending side; its peers listen on each data address's port + `port_offset`
    (with `listener`, see Transport)."""
    TRANSPORTS[name] = Transport(name, sender, port_offset, about, holds_messages, send_buffer, listener,
                                 optional, paces_itself, wire, pick_address, engine, rendezvous)


def use_engine(name: str, engine: Callable[..., object] | None) -> None:
    """Give transport `name` an engine of its own (`engine(*Engine's arguments)` → an engine,
    or None to leave the rank to agent/engine.py): agent/native does so for tcp."""
    TRANSPORTS[name] = replace(get(name), engine=engine)


def get(name: str) -> Transport:
    _builtins()
    try:
        return TRANSPORTS[name or DEFAULT]
    except KeyError:
        raise ValueError(f"unknown transport {name!r}: one of {', '.join(sorted(TRANSPORTS))}") from None


def names() -> list[str]:
    _builtins()
    return sorted(TRANSPORTS)


def lacks(name: str, rdma: str, setting: str = "rdma") -> str:
    """Why a lab whose `rdma` setting (named `setting` to the user) is this cannot carry
    transport `name` ("" when it can): a transport carrying RoCE needs soft-RoCE on its NICs."""
    if get(name).wire == "roce" and rdma != "softroce":
        return f"{name} carries RoCE, which the lab's NICs do not speak: set {setting}: softroce " \
               "(a kernel with per-namespace rdma_rxe), or use tcp"
    return ""


def with_listeners() -> list[Transport]:
    """The transports an agent listens for, each on every data address."""
    _builtins()
    return [t for t in TRANSPORTS.values() if t.listener is not None]


def address_for(name: str, data_address: str) -> str:
    """A peer's `host:port` for transport `name`, given its data address (its gRPC one)."""
    offset = get(name).port_offset
    if not offset:
        return data_address
    host, port = data_address.rsplit(":", 1)
    return f"{host}:{int(port) + offset}"


def data_port(name: str, port: int) -> int:
    """The port a transport's connections go to, for an agent's data `port`."""
    return port + get(name).port_offset


def _builtins() -> None:
    # imported on first use (they import this table): each registers itself
    from orchestrator.agent.transports import grpc_push, rdma, tcp  # noqa: F401
