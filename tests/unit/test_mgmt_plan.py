"""The management network's plan: split over bridges of at most 1,023 ports, names that fit
Linux and `testbed clean`, one subnet, routes that cover exactly the servers behind them."""

from __future__ import annotations

import ipaddress

import pytest

from orchestrator.emulation import lab as lab_module
from orchestrator.emulation.cleanup import ROOT_LINK
from orchestrator.emulation.plan import BRIDGE_MAX_PORTS, LabPlan, bridge_count, mgmt_mac
from orchestrator.errors import TopologyError
from orchestrator.spec import lab_from_argument
from orchestrator.topology.model import IFNAMSIZ
from tests.unit.conftest import make_topology

SUBNET = ipaddress.IPv4Network("198.18.0.0/20")


def plan_of(kind: str, ports: int | None = None, lab: str = "scale", **params) -> LabPlan:
    return LabPlan(lab, make_topology(kind, **params), "netns", SUBNET, bridge_ports=ports)


def ports_per_bridge(plan: LabPlan) -> dict[str, int]:
    counts = dict.fromkeys(plan.mgmt_bridges(), 0)
    for bridge in plan.mgmt_master.values():
        counts[bridge] += 1
    return counts


@pytest.mark.parametrize("servers,bridges", [(1, 1), (1023, 1), (1024, 2), (2046, 2), (2047, 3), (4000, 4)])
def test_bridge_count_keeps_every_bridge_within_the_kernels_port_limit(servers, bridges):
    assert bridge_count(servers) == bridges
    assert BRIDGE_MAX_PORTS == 1023  # BR_MAX_PORTS less the reserved port 0, measured


def test_up_to_1023_servers_share_one_bridge_and_the_subnets_own_route():
    plan = plan_of("fattree", k=8)
    assert plan.mgmt_bridges() == [plan.mgmt_bridge] == [f"tb{plan.id}-br"]
    assert set(plan.mgmt_master.values()) == {plan.mgmt_bridge}
    assert plan.mgmt_routes == []


def test_1024_servers_split_evenly_over_two_bridges():
    plan = plan_of("fattree", k=16)
    assert len(plan.topology.servers) == 1024
    assert ports_per_bridge(plan) == {f"tb{plan.id}-br": 512, f"tb{plan.id}-b1": 512}


@pytest.mark.parametrize("kind,params,ports", [
    ("fattree", {"k": 16}, None),
    ("bcube", {"n": 32, "k": 1}, None),
    ("star", {"servers": 4000}, None),
    ("fattree", {"k": 4}, 5),
    ("fattree", {"k": 4}, 3),
    ("fattree", {"k": 4}, 1),
    ("torus", {"k": 3, "d": 2}, 2),
])
def test_every_bridge_within_its_ports_and_routes_cover_exactly_its_servers(kind, params, ports):
    plan = plan_of(kind, ports, **params)
    limit = ports or BRIDGE_MAX_PORTS
    counts = ports_per_bridge(plan)
    assert max(counts.values()) <= limit
    assert len(counts) == bridge_count(len(plan.topology.servers), limit)
    # the host reaches a server through its own bridge: the most specific route wins, and
    # the first bridge holds the subnet's route
    for server, (_, address) in plan.mgmt.items():
        assert address.network == SUBNET  # one subnet, seen whole by every server
        covering = [bridge for block, bridge in plan.mgmt_routes if address.ip in block]
        assert covering == ([] if plan.mgmt_master[server] == plan.mgmt_bridge else [plan.mgmt_master[server]])
    blocks = [block for block, _ in plan.mgmt_routes]
    assert plan.mgmt_gateway.ip not in {ip for block in blocks for ip in block}
    assert all(not a.overlaps(b) for i, a in enumerate(blocks) for b in blocks[i + 1:])


@pytest.mark.parametrize("lab", ["scale", "a" * 40, "fattree-16"])
def test_root_names_fit_linux_and_are_what_clean_matches(lab):
    plan = plan_of("star", 700, lab=lab, servers=4000)
    names = plan.root_links()
    assert len(names) == len(set(names)) == 4000 + 6
    for name in names:
        assert len(name) <= IFNAMSIZ, name
        assert ROOT_LINK.match(name), name
        assert name.startswith(f"tb{plan.id}-")  # the isolation filter's prefix
    assert not ROOT_LINK.match(f"tb{plan.id}-x1") and not ROOT_LINK.match(f"tb{plan.id}-b")


def test_macs_are_unique_locally_administered_unicast_and_the_gateways_is_apart():
    plan = plan_of("fattree", k=16)
    macs = list(plan.mgmt_macs.values()) + [plan.mgmt_gateway_mac]
    assert len(set(macs)) == len(macs)
    for mac in macs:
        first = int(mac.split(":")[0], 16)
        assert first & 0b10 and not first & 0b01, mac
    assert plan.mgmt_gateway_mac == mgmt_mac(plan.id, 0)
    other = plan_of("fattree", lab="other", k=16)
    assert not set(other.mgmt_macs.values()) & set(plan.mgmt_macs.values())


# -- an explicit management.subnet must not lie in a host network -----------------------------
def _subnet_for(monkeypatch, subnet: str, host: list, labs: list | None = None):
    class Other:
        def __init__(self, name, subnet):
            self.name, self._subnet = name, subnet

        def state(self):
            return {"mgmt_subnet": self._subnet}

    monkeypatch.setattr(lab_module.kernel, "root_networks_on",
                        lambda: [(ipaddress.IPv4Network(n), dev) for n, dev in host])
    monkeypatch.setattr(lab_module.LabState, "all", classmethod(lambda cls: [Other(*o) for o in labs or []]))
    spec = lab_from_argument("fattree,4", **{"management.subnet": subnet, "name": "mine"})
    return lab_module.management_subnet(spec, make_topology("fattree", k=4))


def test_an_explicit_subnet_inside_a_host_route_is_refused_naming_field_network_and_device(monkeypatch):
    with pytest.raises(TopologyError) as caught:
        _subnet_for(monkeypatch, "192.168.5.0/24", [("192.0.2.0/24", "eth0"), ("192.168.0.0/16", "docker0")])
    message = str(caught.value)
    assert "\n" not in message
    for part in ("management.subnet 192.168.5.0/24", "192.168.0.0/16", "docker0", "'auto'"):
        assert part in message, message


def test_an_explicit_subnet_over_another_labs_is_refused(monkeypatch):
    with pytest.raises(TopologyError, match="management network of lab other"):
        _subnet_for(monkeypatch, "198.18.0.0/24", [], labs=[("other", "198.18.0.0/24")])


def test_a_free_explicit_subnet_is_kept_and_auto_skips_host_networks(monkeypatch):
    assert str(_subnet_for(monkeypatch, "198.19.7.0/24", [("198.18.0.0/24", "tbabcdef-br")])) == "198.19.7.0/24"
    assert str(_subnet_for(monkeypatch, "auto", [("198.18.0.0/24", "eth1")])) == "198.18.1.0/24"
