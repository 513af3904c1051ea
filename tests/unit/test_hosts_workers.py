"""The logic above the hosts' engine, without hosts (issue 31): hosts files say how each
host is reached; the Ansible inventory `testbed hosts up` writes is one `ansible-inventory`
reads, with each worker's command; a split lab's record brings the same lab back in another
process and is refused in one line when it is not one; wires of a second lab take other VNIs.
Every state directory is this test's own."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys

import pytest
from pydantic import ValidationError

from orchestrator.errors import EmulationError, LabNotFound
from orchestrator.spec import lab_from_argument
from orchestrator.spec.hosts import HostsSpec
from orchestrator.topology import from_lab
from orchestrator.topology.partition import Host, place


@pytest.fixture(autouse=True)
def own_state(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()


def spec_of(*hosts: dict, **top) -> HostsSpec:
    return HostsSpec.model_validate({"hosts": list(hosts), **top})


def test_hosts_files_say_how_each_host_is_reached():
    spec = spec_of({"name": "x", "address": "10.9.0.1", "netns": "rackx"},
                   {"name": "y", "address": "10.9.0.2", "python": "/opt/testbed/bin/python"}, scheduler="10.9.0.254")
    assert spec.hosts[0].netns == "rackx" and spec.hosts[1].python == "/opt/testbed/bin/python"
    assert spec.scheduler == ipaddress.IPv4Address("10.9.0.254")
    for host, field in (({"name": "x", "address": "10.9.0.1", "python": "python3"}, "python"),
                        ({"name": "x", "address": "10.9.0.1", "python": "/usr/bin/python3 -c x"}, "python"),
                        ({"name": "x", "address": "10.9.0.1", "netns": "../x"}, "netns")):
        with pytest.raises(ValidationError, match=f"hosts.0.{field}"):
            spec_of(host)
    with pytest.raises(ValidationError, match="hosts.1.netns: same is host 0's already"):
        spec_of({"name": "x", "address": "10.9.0.1", "netns": "same"}, {"name": "y", "address": "10.9.0.2", "netns": "same"})


def test_the_inventory_reaches_each_host_its_way_and_ansible_inventory_reads_it(tmp_path):
    from orchestrator.deploy import inventory
    from orchestrator.hosts import workers

    spec = spec_of({"name": "x", "address": "10.9.0.1", "netns": "rackx"},
                   {"name": "y", "address": "10.9.0.2", "python": "/opt/testbed/bin/python"})
    document = workers._inventory(spec, "tls://10.9.0.254:8786", tmp_path / "tls")
    path = tmp_path / "inventory.yaml"
    path.write_text(inventory.to_yaml(document))
    listed = subprocess.run([str(shutil.which("ansible-inventory", path=str(sys.prefix) + "/bin")), "-i", str(path),
                             "--list"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    x, y = hostvars["x"], hostvars["y"]
    assert x["ansible_connection"] == "testbed_nsenter" and x["testbed_netns"] == "rackx"
    assert x["worker_env"]["TESTBED_STATE"] == str(workers.engine_dir() / "hosts" / "x" / "state")
    assert x["worker_env"]["TESTBED_NETNS_PREFIX"] != y["worker_env"].get("TESTBED_NETNS_PREFIX")
    assert y["ansible_host"] == "10.9.0.2" and y["ansible_user"] == "root" and "TESTBED_STATE" not in y["worker_env"]
    assert y["worker_command"].startswith("/opt/testbed/bin/python -m distributed.cli.dask_worker tls://10.9.0.254:8786")
    assert "--resources host_y=1" in y["worker_command"] and f"{workers.REAL_HOME}/tls/worker.key" in y["worker_command"]
    assert y["worker_tls_sources"]["worker.key"] == str(tmp_path / "tls" / "worker-y.key")


class NoEngine:
    name = "none"


def split_lab(name: str, argument: str = "bcube,2,1"):
    from orchestrator.emulation.plan import LabPlan
    from orchestrator.hosts import split, wires

    spec = lab_from_argument(argument, name=name, **{"servers.runtime": "netns", "management.subnet": "198.18.4.0/24"})
    topology = from_lab(spec)
    placement = place(topology, [Host("x"), Host("y", nic_bps=1e10, mtu=9000)])
    planned = tuple(wires.plan(topology, placement, taken=split.vnis_taken(["x", "y"])))
    plan = LabPlan(name, topology, "netns", spec.management.subnet)
    routes = tuple(ipaddress.IPv4Network(address.ip) for _, address in plan.mgmt.values())
    underlay = {"x": ipaddress.IPv4Address("10.9.0.1"), "y": ipaddress.IPv4Address("10.9.0.2")}
    return split.SplitLab(spec, topology, placement, planned, plan, NoEngine(), routes, underlay)


def test_a_split_labs_record_brings_the_same_lab_back():
    from orchestrator.hosts import split

    lab = split_lab("rec")
    split._save(lab, "up")
    assert split.exists("rec") and split.names() == ["rec"]
    back = split.attach("rec", NoEngine())
    assert back.spec == lab.spec and back.routes == lab.routes and back.underlay == lab.underlay
    assert back.placement == lab.placement and back.wires == lab.wires
    assert back.plan.mgmt == lab.plan.mgmt
    # a second lab on the same hosts takes other VNIs
    second = split_lab("rec2")
    assert second.wires and not {w.vni for w in second.wires} & {w.vni for w in lab.wires}


def test_a_record_that_is_not_one_is_refused_in_one_line(tmp_path):
    from orchestrator.hosts import split

    with pytest.raises(LabNotFound, match="no split lab named 'nosuch'"):
        split.attach("nosuch", NoEngine())
    split._save(split_lab("bad"), "up")
    record = tmp_path / "state" / "split" / "bad" / "split.json"
    for text in ("{not json", "[1, 2]", json.dumps({"spec": {"name": "bad"}}), json.dumps({"spec": None})):
        record.write_text(text)
        with pytest.raises(EmulationError) as raised:
            split.attach("bad", NoEngine())
        assert "\n" not in str(raised.value) and "testbed clean bad" in str(raised.value)
    good = split_lab("bad2")
    split._save(good, "up")
    data = json.loads((tmp_path / "state" / "split" / "bad2" / "split.json").read_text())
    data["wires"] = [[10**6, 5000, "x", "y"]]  # a link the lab does not have
    (tmp_path / "state" / "split" / "bad2" / "split.json").write_text(json.dumps(data))
    with pytest.raises(EmulationError, match="does not describe a lab"):
        split.attach("bad2", NoEngine())


def test_no_hosts_up_is_said_in_one_line():
    from orchestrator.hosts import workers

    assert workers.record() is None and workers.status() == {"up": False, "hosts": {}}
    with pytest.raises(workers.HostsError, match="no hosts are up: `testbed hosts up FILE` starts them"):
        workers.connect()
    workers.engine_dir().mkdir(parents=True)
    (workers.engine_dir() / "engine.json").write_text("[]")
    with pytest.raises(workers.HostsError, match="not a hosts record: `testbed hosts down` removes it"):
        workers.record()
    assert workers.down(lambda *_: None) == {"stopped": [], "removed": str(workers.engine_dir())}
    assert not workers.engine_dir().exists()
