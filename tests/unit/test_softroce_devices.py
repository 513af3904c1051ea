"""Which soft-RoCE devices are made again when a server's links come back (emulation/softroce.py):
those of the server whose management queue pair (GSI) rxe put in its error state. The real
devices are exercised in the vm tier (tests/vm/guest/test_softroce.py: rejoin over rdma)."""

from __future__ import annotations

import json
import subprocess

import pytest

from orchestrator.emulation import softroce
from orchestrator.errors import EmulationError

LISTED = [  # `rdma -j res show qp` in shared mode lists every device's queue pairs
    {"ifname": "rxe_ab12_h0_eth0", "port": 1, "lqpn": 1, "type": "GSI", "state": "RTS"},
    {"ifname": "rxe_ab12_h2_eth0", "port": 1, "lqpn": 1, "type": "GSI", "state": "ERR"},
    {"ifname": "rxe_ab12_h2_eth0", "port": 1, "lqpn": 19, "type": "RC", "state": "ERR"},
    {"ifname": "rxe_ab12_h2_eth1", "port": 1, "lqpn": 1, "type": "GSI", "state": "RTS"},
    {"ifname": "rxe_ab12_h3_eth0", "port": 1, "lqpn": 1, "type": "GSI", "state": "ERR"},  # another server's
]


def test_only_the_servers_devices_whose_management_queue_pair_died_are_dead():
    mine = {"rxe_ab12_h2_eth0", "rxe_ab12_h2_eth1"}
    assert softroce.dead(LISTED, mine) == {"rxe_ab12_h2_eth0"}
    assert softroce.dead(LISTED, {"rxe_ab12_h0_eth0"}) == set()  # an RC queue pair in error is a connection's
    assert softroce.dead([], mine) == set()


def test_device_names_follow_the_lab_and_the_nic():
    assert softroce.device_name("ab12", "h2-eth0") == "rxe_ab12_h2_eth0"
    from orchestrator import topology
    from orchestrator.spec import lab_from_argument

    h01 = next(s for s in topology.from_lab(lab_from_argument("bcube,2,1")).servers if s.name == "h01")
    assert softroce.devices("ab12", h01) == {f"rxe_ab12_{nic.name}".replace("-", "_"): nic.name
                                             for nic in h01.data_nics()}
    assert len(softroce.devices("ab12", h01)) == 2  # one per data NIC of a two-NIC BCube server


def fake_rdma(listing: str, returncode: int = 0, fail_add: bool = False):
    calls: list[tuple[str, ...]] = []

    def rdma(namespace: str, *argv: str) -> subprocess.CompletedProcess:
        calls.append((namespace, *argv))
        if argv[:1] == ("-j",):
            return subprocess.CompletedProcess(argv, returncode, listing, "")
        if argv[:2] == ("link", "add") and fail_add:
            return subprocess.CompletedProcess(argv, 1, "", "rdma: operation not supported")
        return subprocess.CompletedProcess(argv, 0, "", "")
    return rdma, calls


def test_repair_makes_a_dead_device_again_on_its_netdev_and_leaves_the_rest(monkeypatch):
    rdma, calls = fake_rdma(json.dumps(LISTED))
    monkeypatch.setattr(softroce, "_rdma", rdma)
    made = softroce.repair("tbab12-h2", {"rxe_ab12_h2_eth0": "eth0", "rxe_ab12_h2_eth1": "eth1"})
    assert made == ["rxe_ab12_h2_eth0"]
    assert calls[1:] == [("tbab12-h2", "link", "delete", "rxe_ab12_h2_eth0"),
                         ("tbab12-h2", "link", "add", "rxe_ab12_h2_eth0", "type", "rxe", "netdev", "eth0")]


@pytest.mark.parametrize("listing,returncode", [("not json", 0), ("", 0), ("[]", 255)])
def test_an_unreadable_listing_repairs_nothing(monkeypatch, listing, returncode):
    rdma, calls = fake_rdma(listing, returncode)
    monkeypatch.setattr(softroce, "_rdma", rdma)
    assert softroce.repair("ns", {"rxe_ab12_h2_eth0": "eth0"}) == []
    assert len(calls) == 1


def test_a_device_that_cannot_be_made_again_says_which_netdev(monkeypatch):
    rdma, _ = fake_rdma(json.dumps(LISTED), fail_add=True)
    monkeypatch.setattr(softroce, "_rdma", rdma)
    with pytest.raises(EmulationError, match="soft-RoCE on eth0: rdma: operation not supported"):
        softroce.repair("ns", {"rxe_ab12_h2_eth0": "eth0"})


def test_a_docker_server_of_a_softroce_lab_is_given_the_hosts_rdma_devices(tmp_path):
    """Docker servers reach rxe's verbs through the host's /dev/infiniband: bound in whole, so
    that uverbs nodes made after the container started appear inside, with the device cgroup
    opened to uverbs (major 231) and to rdma_cm's own numbers. A host without an RDMA stack
    gives nothing (the lab's feature check has refused softroce there already)."""
    import os
    import stat

    from orchestrator.emulation.docker_engine import rdma_access

    assert rdma_access(tmp_path / "no-such") == {}
    devices = tmp_path / "infiniband"
    devices.mkdir()
    assert rdma_access(devices) == {"binds": {str(devices): {"bind": str(devices), "mode": "rw"}},
                                    "device_cgroup_rules": ["c 231:* rwm"]}
    os.mknod(devices / "rdma_cm", 0o600 | stat.S_IFCHR, os.makedev(10, 123))
    assert rdma_access(devices)["device_cgroup_rules"] == ["c 231:* rwm", "c 10:123 rwm"]
