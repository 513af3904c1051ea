"""The Ansible inventory made from a lab (orchestrator/deploy/inventory.py), checked by Ansible
itself: `ansible-inventory -i FILE --list` over each format lists every server with its vars
and the topology's groups. No lab is built: a Lab object is only its spec, plan and state."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.deploy import agents, inventory
from orchestrator.deploy.deployers import NsenterAccess, SshAccess, document
from orchestrator.deploy.playbook import PLAYBOOKS
from orchestrator.emulation.journal import LabState
from orchestrator.emulation.lab import Lab
from orchestrator.emulation.plan import LabPlan
from orchestrator.errors import BadUsage
from orchestrator.spec import lab_from_argument
from orchestrator.topology import from_lab

BIN = Path(sys.executable).parent


@pytest.fixture
def make_lab(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE", str(tmp_path / "state"))

    def make(argument: str, runtime: str = "docker") -> Lab:
        spec = lab_from_argument(argument, name="inv", **{"servers.runtime": runtime})
        plan = LabPlan(spec.name, from_lab(spec), runtime, ipaddress.IPv4Network("198.18.4.0/24"))
        state = LabState(spec.name)
        state.dir.mkdir(parents=True)
        return Lab(spec, plan, state)

    return make


def ansible(tool: str, *args: str, home: Path) -> str:
    return subprocess.run([str(BIN / tool), *args], check=True, capture_output=True, text=True, cwd=PLAYBOOKS,
                          env={"ANSIBLE_HOME": str(home), "PATH": f"{BIN}:/usr/bin:/bin"}).stdout


def members(listed: dict, group: str) -> set[str]:
    """Hosts of a group in `ansible-inventory --list` output, through its child groups."""
    entry = listed.get(group, {})
    return set(entry.get("hosts", [])).union(*(members(listed, child) for child in entry.get("children", [])))


@pytest.mark.parametrize("fmt", ["yaml", "json", "ini"])
def test_ansible_lists_every_server_with_its_vars_and_groups(make_lab, tmp_path, fmt):
    lab = make_lab("bcube,4,1")
    doc = document(lab, NsenterAccess(), roles={"h32": "ps", "h33": "ps"})
    path = tmp_path / f"lab.{fmt}"
    path.write_text(inventory.render(doc, fmt))
    listed = json.loads(ansible("ansible-inventory", "-i", str(path), "--list", home=tmp_path))
    hostvars = listed["_meta"]["hostvars"]
    assert sorted(hostvars) == sorted(s.name for s in lab.topology.servers)
    h13 = hostvars["h13"]
    assert h13["rank"] == 7 and h13["mgmt_address"] == "198.18.4.9"
    assert h13["data_addresses"] == ["10.0.1.4", "10.1.3.2"]
    assert h13["nics"] == [{"name": "h13-eth0", "address": "10.0.1.4/24", "level": 0},
                           {"name": "h13-eth1", "address": "10.1.3.2/24", "level": 1}]
    assert h13["nic_addresses"] == {"0": "10.0.1.4", "1": "10.1.3.2"}
    assert h13["testbed_container"] == "testbed-inv-h13" and h13["ansible_connection"] == "testbed_nsenter"
    assert h13["testbed_secret_file"] == str(lab.state.dir / "token") and h13["agent_window"] == 2**20
    assert members(listed, "ps") == {"h32", "h33"} and len(members(listed, "workers")) == 14
    assert members(listed, "l0s1") == {"h10", "h11", "h12", "h13"}
    assert members(listed, "l1s1") == {"h01", "h11", "h21", "h31"}
    assert members(listed, "level0") == members(listed, "level1") == set(hostvars)
    assert all(token not in path.read_text() for token in (agents.agent_token(agents.lab_secret(lab.state.dir), "h13"),))


@pytest.mark.parametrize("argument, groups", [
    ("fattree,4", {"pod0": {"p0e0h0", "p0e0h1", "p0e1h0", "p0e1h1"}, "pod3": {"p3e0h0", "p3e0h1", "p3e1h0", "p3e1h1"}}),
    ("bigraph,4,2", {"upper": {"su0h0", "su0h1", "su1h0", "su1h1"}, "lower": {"sl0h0", "sl0h1", "sl1h0", "sl1h1"},
                     "su1": {"su1h0", "su1h1"}}),
    ("torus,3,2", {"dim0": {f"t{i}{j}" for i in range(3) for j in range(3)}, "dim1_ring2": {"t20", "t21", "t22"}}),
    ("leafspine,2,2,2", {"l1": {"l1h0", "l1h1"}}),
    ("star,3", {"workers": {"h0", "h1", "h2"}}),
])
def test_each_topology_kind_gets_its_groups(make_lab, tmp_path, argument, groups):
    lab = make_lab(argument, runtime="netns")
    path = tmp_path / "lab.yaml"
    path.write_text(inventory.render(document(lab, NsenterAccess()), "yaml"))
    listed = json.loads(ansible("ansible-inventory", "-i", str(path), "--list", home=tmp_path))
    for group, hosts in groups.items():
        assert members(listed, group) == hosts, group
    some = lab.topology.servers[0].name
    assert listed["_meta"]["hostvars"][some]["testbed_netns"] == f"testbed-inv-{some}"


def test_every_structured_kind_of_topology_has_a_group_maker():
    from orchestrator.topology import KINDS

    assert {name for name, kind in KINDS.items() if kind.groups is not None} >= set(KINDS) - {"graph"}


def test_the_ssh_inventory_reaches_management_addresses_with_the_labs_keys_strictly(make_lab):
    lab = make_lab("star,2")
    doc = document(lab, SshAccess())
    h1 = doc["all"]["hosts"]["h1"] | doc["all"]["vars"]
    assert h1["ansible_host"] == "198.18.4.3" and h1["ansible_connection"] == "ssh" and h1["ansible_user"] == "root"
    assert h1["ansible_ssh_private_key_file"] == str(lab.state.dir / "deploy" / "ssh" / "id_ed25519")
    assert "StrictHostKeyChecking=yes" in h1["ansible_ssh_args"] and "PasswordAuthentication=no" in h1["ansible_ssh_args"]


def test_the_playbooks_token_lookup_derives_the_orchestrators_token(make_lab, tmp_path):
    lab = make_lab("star,2")
    secret = agents.secret_file(lab.state.dir)
    shown = ansible("ansible", "localhost", "-m", "ansible.builtin.debug", "-a",
                    f"msg={{{{ lookup('testbed_token', 'h1', secret_file='{secret}') }}}}", home=tmp_path)
    expected = agents.agent_token(agents.lab_secret(lab.state.dir), "h1")
    assert expected == hmac.new(secret.read_bytes().strip(), b"h1", hashlib.sha256).hexdigest()
    assert f'"msg": "{expected}"' in shown


def test_unknown_servers_and_formats_are_one_line_errors(make_lab):
    lab = make_lab("star,2")
    with pytest.raises(BadUsage, match=r"^lab inv has no server 'h9' \(its servers: h0 … h1\)$"):
        document(lab, NsenterAccess(), roles={"h9": "ps"})
    with pytest.raises(BadUsage, match=r"^--format toml: choose one of yaml, json, ini$"):
        inventory.render(document(lab, NsenterAccess()), "toml")
