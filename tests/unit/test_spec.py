"""Lab files: spec/loader.py validate/load and spec.load_lab — defaults and one-line errors."""

from __future__ import annotations

import ipaddress
import re

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError, TestbedError
from orchestrator.spec import topology_kinds, LabSpec, load, load_lab, read_yaml, validate
from orchestrator.spec.lab import (
    BCubeSpec,
    BiGraphSpec,
    FatTreeSpec,
    LeafSpineSpec,
    StarSpec,
    TorusSpec,
)

SOURCE = "lab.yaml"
MINIMAL = {"name": "lab", "topology": {"kind": "bcube", "n": 4, "k": 1}}


def with_(**changes):
    """MINIMAL with top-level keys replaced (a copy)."""
    return {**MINIMAL, **changes}


def spec_error(data, source=SOURCE) -> SpecError:
    with pytest.raises(SpecError) as caught:
        validate(LabSpec, data, source)
    return caught.value


def assert_one_line(error: SpecError, source: str = SOURCE) -> str:
    message = str(error)
    assert "\n" not in message and "\r" not in message, message
    assert message.startswith(f"{source}: ") or message.startswith(f"{source}:"), message
    assert error.exit_code == 2
    assert isinstance(error, TestbedError)
    assert "Traceback" not in message
    return message


def write(tmp_path, text: str, name: str = "lab.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# -- the minimal file and its defaults ----------------------------------------------------


def test_minimal_file_gets_documented_defaults(tmp_path):
    path = write(tmp_path, "name: bcube-4-1\ntopology: {kind: bcube, n: 4, k: 1}\n")
    lab = load(LabSpec, path)
    assert lab.name == "bcube-4-1"
    assert lab.topology == BCubeSpec(kind="bcube", n=4, k=1)
    assert lab.links.bandwidth == 10**9  # 1Gbit
    assert lab.links.delay == 0.0
    assert lab.links.jitter == 0.0
    assert lab.links.loss == 0.0
    assert lab.links.queue == 1000
    assert lab.links.mtu == 1500
    assert lab.links.needs_netem is False
    assert lab.servers.runtime == "docker"
    assert lab.servers.image == "testbed/server:latest"
    assert lab.servers.cpus is None
    assert lab.servers.memory is None
    assert lab.servers.tcp_congestion == "cubic"
    assert lab.servers.initcwnd == 100 and lab.servers.tcp_slow_start_after_idle is False
    assert lab.rdma == "none"
    assert lab.management.subnet == "auto"
    assert lab.addressing.data == ipaddress.IPv4Network("10.0.0.0/8")
    assert lab.addressing.links == ipaddress.IPv4Network("172.16.0.0/12")


def test_load_lab_is_load_of_labspec(tmp_path):
    path = write(tmp_path, "name: lab\ntopology: {kind: star, servers: 8}\n")
    assert load_lab(path) == load(LabSpec, path) == validate(LabSpec, MINIMAL | {
        "topology": {"kind": "star", "servers": 8}}, "x")
    assert load_lab(str(path)) == load_lab(path)


def test_read_yaml_returns_the_mapping(tmp_path):
    path = write(tmp_path, "name: lab\ntopology: {kind: star, servers: 8}\n")
    assert read_yaml(path) == {"name": "lab", "topology": {"kind": "star", "servers": 8}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{kind: bcube, n: 4, k: 1}", BCubeSpec(kind="bcube", n=4, k=1)),
        ("{kind: fattree, k: 4}", FatTreeSpec(kind="fattree", k=4)),
        ("{kind: torus, k: 4, d: 2}", TorusSpec(kind="torus", k=4, d=2)),
        (
            "{kind: bigraph, switches: 4, servers_per_switch: 2}",
            BiGraphSpec(kind="bigraph", switches=4, servers_per_switch=2),
        ),
        (
            "{kind: leafspine, leaves: 4, spines: 2, servers_per_leaf: 4}",
            LeafSpineSpec(kind="leafspine", leaves=4, spines=2, servers_per_leaf=4),
        ),
        ("{kind: star, servers: 8}", StarSpec(kind="star", servers=8)),
    ],
)
def test_issue_topology_spellings_parse(tmp_path, text, expected):
    path = write(tmp_path, f"name: lab\ntopology: {text}\n")
    lab = load_lab(path)
    assert lab.topology == expected
    assert lab.topology.kind in topology_kinds()


def test_issue_example_block_parses(tmp_path):
    path = write(
        tmp_path,
        "name: bcube-4-1\n"
        "topology: {kind: bcube, n: 4, k: 1}\n"
        "links: {bandwidth: 100Mbit, delay: 0ms, loss: 0, queue: 1000}\n"
        "servers: {runtime: docker, image: testbed/server:latest, cpus: 0.5, memory: 512M}\n"
        "rdma: none\n",
    )
    lab = load_lab(path)
    assert lab.links.bandwidth == 100 * 10**6
    assert lab.links.delay == 0.0
    assert lab.links.loss == 0.0
    assert lab.links.queue == 1000
    assert lab.links.needs_netem is False
    assert lab.servers.runtime == "docker"
    assert lab.servers.image == "testbed/server:latest"
    assert lab.servers.cpus == 0.5
    assert lab.servers.memory == 512 * 2**20
    assert lab.rdma == "none"


def test_docstring_example_parses(tmp_path):
    """The full example in spec/lab.py's docstring is a valid lab file."""
    path = write(
        tmp_path,
        "name: bcube-4-1\n"
        "topology: {kind: bcube, n: 4, k: 1}\n"
        "links: {bandwidth: 100Mbit, delay: 0ms, jitter: 0ms, loss: 0, queue: 1000}\n"
        "servers: {runtime: docker, image: testbed/server:latest, cpus: 0.5, memory: 512M}\n"
        "rdma: none\n"
        "management: {subnet: 198.18.5.0/24}\n"
        "addressing: {data: 10.0.0.0/8, links: 172.16.0.0/12}\n",
    )
    lab = load_lab(path)
    assert lab.management.subnet == ipaddress.IPv4Network("198.18.5.0/24")
    assert lab.rdma == "none"


def test_netem_values_parse():
    lab = validate(
        LabSpec,
        with_(links={"bandwidth": "1.5Gbps", "delay": "2ms", "jitter": "500us", "loss": "1%"},
              rdma="softroce", servers={"runtime": "netns"}),
        SOURCE,
    )
    assert lab.links.bandwidth == 1_500_000_000
    assert lab.links.delay == pytest.approx(0.002)
    assert lab.links.jitter == pytest.approx(0.0005)
    assert lab.links.loss == 1.0
    assert lab.links.needs_netem is True
    assert lab.rdma == "softroce"
    assert lab.servers.runtime == "netns"


def test_jitter_equal_to_delay_is_allowed():
    lab = validate(LabSpec, with_(links={"delay": "1ms", "jitter": "1ms"}), SOURCE)
    assert lab.links.jitter == lab.links.delay


# -- bad input: one line, file name first, the field path, exit code 2 ---------------------

TOPO = MINIMAL["topology"]

# (id, data, the field path that must follow "lab.yaml: ", words the message must contain)
BAD = [
    ("missing-name", {"topology": TOPO}, "name", ["required"]),
    ("missing-topology", {"name": "lab"}, "topology", ["required"]),
    ("unknown-kind", with_(topology={"kind": "mesh", "n": 4}), "topology.kind",
     ["mesh", "bcube", "fattree", "torus", "bigraph", "leafspine", "star"]),
    ("missing-kind", with_(topology={"n": 4, "k": 1}), "topology.kind",
     ["missing", "bcube"]),
    ("kind-null", with_(topology={"kind": None}), "topology.kind", ["bcube"]),
    ("topology-not-mapping", with_(topology="bcube"), "topology", []),
    ("topology-list", with_(topology=["bcube", 4, 1]), "topology", []),
    ("unknown-top-key", {**MINIMAL, "nmae": "x"}, "nmae", ["unknown", "did you mean 'name'"]),
    ("unknown-top-key-links", {**MINIMAL, "linkz": {}}, "linkz",
     ["unknown", "did you mean 'links'"]),
    ("unknown-links-key", with_(links={"bandwith": "1Gbit"}), "links.bandwith",
     ["unknown", "did you mean 'bandwidth'"]),
    ("tcp-congestion-not-a-name", with_(servers={"tcp_congestion": "cubic; rm"}), "servers.tcp_congestion", []),
    ("slow-start-not-a-bool", with_(servers={"tcp_slow_start_after_idle": "sometimes"}),
     "servers.tcp_slow_start_after_idle", []),
    ("unknown-servers-key", with_(servers={"runtme": "docker"}), "servers.runtme",
     ["unknown", "did you mean 'runtime'"]),
    ("unknown-topology-key", with_(topology={"kind": "bcube", "n": 4, "k": 1, "m": 3}),
     "topology.m", ["unknown", "kind, n, k"]),
    ("unknown-topology-key-typo", with_(topology={"kind": "torus", "k": 4, "d": 2, "dd": 3}),
     "topology.dd", ["unknown", "did you mean 'd'"]),
    ("unknown-addressing-key", with_(addressing={"datas": "10.0.0.0/8"}), "addressing.datas",
     ["unknown", "did you mean 'data'"]),
    ("unknown-management-key", with_(management={"subnets": "auto"}), "management.subnets",
     ["unknown", "did you mean 'subnet'"]),
    ("n-string", with_(topology={"kind": "bcube", "n": "four", "k": 1}), "topology.n",
     ["integer"]),
    ("n-fraction", with_(topology={"kind": "bcube", "n": 4.5, "k": 1}), "topology.n", []),
    ("n-list", with_(topology={"kind": "bcube", "n": [4], "k": 1}), "topology.n", []),
    ("n-too-small", with_(topology={"kind": "bcube", "n": 1, "k": 1}), "topology.n", ["2"]),
    ("n-zero", with_(topology={"kind": "bcube", "n": 0, "k": 1}), "topology.n", []),
    ("n-negative", with_(topology={"kind": "bcube", "n": -4, "k": 1}), "topology.n", []),
    ("k-negative", with_(topology={"kind": "bcube", "n": 4, "k": -1}), "topology.k", []),
    ("k-missing", with_(topology={"kind": "bcube", "n": 4}), "topology.k", ["required"]),
    ("fattree-odd", with_(topology={"kind": "fattree", "k": 5}), "topology.k", ["even", "5"]),
    ("fattree-zero", with_(topology={"kind": "fattree", "k": 0}), "topology.k", []),
    ("torus-d-zero", with_(topology={"kind": "torus", "k": 4, "d": 0}), "topology.d", []),
    ("torus-k-one", with_(topology={"kind": "torus", "k": 1, "d": 2}), "topology.k", []),
    ("bigraph-odd", with_(topology={"kind": "bigraph", "switches": 5, "servers_per_switch": 2}),
     "topology.switches", ["even", "5"]),
    ("bigraph-zero-servers",
     with_(topology={"kind": "bigraph", "switches": 4, "servers_per_switch": 0}),
     "topology.servers_per_switch", []),
    ("leafspine-zero-leaves",
     with_(topology={"kind": "leafspine", "leaves": 0, "spines": 2, "servers_per_leaf": 4}),
     "topology.leaves", []),
    ("leafspine-missing-spines",
     with_(topology={"kind": "leafspine", "leaves": 2, "servers_per_leaf": 4}),
     "topology.spines", ["required"]),
    ("star-zero", with_(topology={"kind": "star", "servers": 0}), "topology.servers", []),
    ("star-negative", with_(topology={"kind": "star", "servers": -3}), "topology.servers", []),
    ("bandwidth-unit", with_(links={"bandwidth": "100Mbyte"}), "links.bandwidth",
     ["100Mbyte", "100Mbit"]),
    ("bandwidth-word", with_(links={"bandwidth": "fast"}), "links.bandwidth", ["fast"]),
    ("bandwidth-zero", with_(links={"bandwidth": 0}), "links.bandwidth", ["positive"]),
    ("bandwidth-negative", with_(links={"bandwidth": -100}), "links.bandwidth", []),
    ("bandwidth-negative-text", with_(links={"bandwidth": "-100Mbit"}), "links.bandwidth", []),
    ("bandwidth-list", with_(links={"bandwidth": [1]}), "links.bandwidth", []),
    ("delay-unit", with_(links={"delay": "5m"}), "links.delay", ["5m"]),
    ("delay-word", with_(links={"delay": "soon"}), "links.delay", []),
    ("delay-negative-text", with_(links={"delay": "-1ms"}), "links.delay", []),
    ("jitter-unit", with_(links={"jitter": "1h"}), "links.jitter", []),
    ("loss-over", with_(links={"loss": 150}), "links.loss", ["150"]),
    ("loss-negative", with_(links={"loss": -1}), "links.loss", []),
    ("loss-word", with_(links={"loss": "some"}), "links.loss", []),
    ("loss-percent-over", with_(links={"loss": "101%"}), "links.loss", []),
    ("queue-zero", with_(links={"queue": 0}), "links.queue", []),
    ("queue-word", with_(links={"queue": "many"}), "links.queue", []),
    ("mtu-small", with_(links={"mtu": 100}), "links.mtu", ["576"]),
    ("mtu-large", with_(links={"mtu": 70000}), "links.mtu", ["65535"]),
    ("mtu-word", with_(links={"mtu": "jumbo"}), "links.mtu", []),
    ("links-not-mapping", with_(links="fast"), "links", []),
    ("links-null", with_(links=None), "links", []),
    ("runtime", with_(servers={"runtime": "podman"}), "servers.runtime",
     ["podman", "docker", "netns"]),
    ("cpus-zero", with_(servers={"cpus": 0}), "servers.cpus", []),
    ("cpus-negative", with_(servers={"cpus": -1}), "servers.cpus", []),
    ("cpus-word", with_(servers={"cpus": "half"}), "servers.cpus", []),
    ("memory-unit", with_(servers={"memory": "512X"}), "servers.memory", ["512X"]),
    ("memory-zero", with_(servers={"memory": 0}), "servers.memory", []),
    ("memory-negative", with_(servers={"memory": -512}), "servers.memory", []),
    ("image-empty", with_(servers={"image": ""}), "servers.image", []),
    ("rdma", with_(rdma="roce"), "rdma", ["roce", "none", "softroce"]),
    ("rdma-bool", with_(rdma=True), "rdma", []),
    ("data-cidr", with_(addressing={"data": "10.0.0.0/33"}), "addressing.data", []),
    ("data-word", with_(addressing={"data": "banana"}), "addressing.data", ["banana"]),
    ("links-cidr", with_(addressing={"links": "172.16.0.300/24"}), "addressing.links", []),
    ("links-host-bits", with_(addressing={"links": "172.16.0.1/12"}), "addressing.links", []),
    ("pools-overlap", with_(addressing={"data": "10.0.0.0/8", "links": "10.1.0.0/16"}),
     "addressing", ["overlap", "10.0.0.0/8", "10.1.0.0/16"]),
    ("pools-identical", with_(addressing={"data": "10.0.0.0/8", "links": "10.0.0.0/8"}),
     "addressing", ["overlap"]),
    ("management-over-data", with_(management={"subnet": "10.1.0.0/24"}), "management.subnet",
     ["overlap", "addressing.data"]),
    ("management-over-links", with_(management={"subnet": "172.16.5.0/24"}),
     "management.subnet", ["overlap", "addressing.links"]),
    ("management-over-custom-data",
     with_(management={"subnet": "192.168.0.0/24"}, addressing={"data": "192.168.0.0/16"}),
     "management.subnet", ["overlap", "addressing.data"]),
    ("name-upper", with_(name="Bad_Name"), "name", ["Bad_Name"]),
    ("name-long", with_(name="a" * 25), "name", ["24"]),
    ("name-leading-dash", with_(name="-lab"), "name", []),
    ("name-space", with_(name="my lab"), "name", []),
    ("name-slash", with_(name="a/b"), "name", []),
    ("name-newline", with_(name="lab\n"), "name", []),
    ("name-empty", with_(name=""), "name", []),
    ("name-number", with_(name=123), "name", []),
    ("name-null", with_(name=None), "name", []),
]


@pytest.mark.parametrize(("data", "field", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_naming_the_field(data, field, words):
    error = spec_error(data)
    message = assert_one_line(error)
    assert message.startswith(f"{SOURCE}: {field}: ") or message.startswith(
        f"{SOURCE}: {field} "
    ), message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize(
    "subnet", ["10.0.0.300/24", "nonsense", "198.18.5.1/24", "198.18.5.0/33", "::1/128", None]
)
def test_invalid_management_subnet_names_the_field(subnet):
    # Regression: management.subnet is `Network | Literal["auto"]` (a plain union), so pydantic's
    # error location carries the union member's internal tag, and loader.describe prints it:
    # "lab.yaml: management.subnet.lax-or-strict[lax=function-plain[ip_v4_network_validator()],
    # strict=json-or-python[...]]: input is not a valid IPv4 network (got '10.0.0.300/24')".
    # The field path should be just `management.subnet` (loader._walk should drop the tag).
    message = assert_one_line(spec_error(with_(management={"subnet": subnet})))
    assert message.startswith(f"{SOURCE}: management.subnet: "), message
    assert str(subnet) in message


@pytest.mark.parametrize(
    ("topology", "typo", "meant"),
    [
        ({"kind": "star", "server": 4}, "server", "servers"),
        ({"kind": "bigraph", "switches": 4, "servers_per_swich": 2}, "servers_per_swich",
         "servers_per_switch"),
    ],
)
def test_misspelled_required_key_is_reported_as_unknown(topology, typo, meant):
    # Regression: loader.describe reports only exc.errors()[0], and pydantic lists
    # `missing` (model field order) before `extra_forbidden`. A misspelled *required* key
    # therefore yields "lab.yaml: topology.servers: required but missing" and never mentions
    # the key the user actually wrote nor suggests the fix; the did-you-mean hint only works
    # for optional keys. describe() should prefer an extra_forbidden error that is a close
    # match of a missing field: "topology.server: unknown key; did you mean 'servers'?".
    message = assert_one_line(spec_error(with_(topology=topology)))
    assert typo in message.replace(f"topology.{meant}:", ""), message
    assert f"did you mean '{meant}'" in message, message


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param(with_(links={"bandwidth": float("inf")}), "links.bandwidth", id="bandwidth-inf"),
        pytest.param(with_(links={"delay": -5}), "links.delay", id="delay-negative-number"),
        pytest.param(with_(links={"delay": float("inf")}), "links.delay", id="delay-inf"),
        pytest.param(with_(links={"jitter": -1}), "links.jitter", id="jitter-negative-number"),
    ],
)
def test_non_finite_and_negative_numbers_name_the_field(data, field):
    # Regression (units.parse_rate / parse_duration, surfacing in LinksSpec):
    # - `bandwidth: .inf` raises a raw OverflowError out of validate() (no SpecError at all).
    # - `delay: -5` (a YAML number) becomes -0.005 s; the only complaint is the cross-field
    #   "lab.yaml: links: jitter must not exceed delay", which blames jitter, not links.delay.
    # - `delay: .inf` and `jitter: -1` are accepted silently (delay=inf, jitter=-0.001 s).
    message = assert_one_line(spec_error(data))
    assert message.startswith(f"{SOURCE}: {field}: "), message


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param(with_(topology={"kind": "bcube", "n": 4, "k": True}), "topology.k",
                     id="k-true"),
        pytest.param(with_(topology={"kind": "star", "servers": True}), "topology.servers",
                     id="servers-true"),
        pytest.param(with_(links={"queue": True}), "links.queue", id="queue-true"),
        pytest.param(with_(links={"mtu": True}), "links.mtu", id="mtu-true"),
    ],
)
def test_booleans_are_not_counts(data, field):
    # Regression: pydantic's lax int accepts booleans, so `topology: {kind: bcube, n: 4, k: yes}`
    # (YAML `yes`/`true`/`on` are booleans) silently becomes k=1, `servers: true` becomes a
    # one-server star. A boolean where a count is expected is a wrong type; the int fields of
    # spec/lab.py should be strict about bool.
    message = assert_one_line(spec_error(data))
    assert message.startswith(f"{SOURCE}: {field}: "), message


def test_infinite_cpus_rejected():
    # Regression: ServersSpec.cpus is `float > 0` and pydantic allows inf, so `cpus: .inf` passes
    # validation (cpus=inf) and would only fail later inside Docker.
    message = assert_one_line(spec_error(with_(servers={"cpus": float("inf")})))
    assert message.startswith(f"{SOURCE}: servers.cpus: "), message


def test_jitter_greater_than_delay():
    message = assert_one_line(spec_error(with_(links={"delay": "1ms", "jitter": "2ms"})))
    assert message.startswith(f"{SOURCE}: links"), message
    assert "jitter" in message and "delay" in message


def test_source_name_is_what_the_caller_passes():
    message = assert_one_line(spec_error({"topology": TOPO}, "topologies/x.yaml"),
                              "topologies/x.yaml")
    assert message.startswith("topologies/x.yaml: name: ")


def test_unknown_key_lists_known_keys_without_bogus_suggestion():
    message = assert_one_line(spec_error({**MINIMAL, "zzzzzz": 1}))
    assert message.startswith(f"{SOURCE}: zzzzzz: unknown key")
    assert "did you mean" not in message
    for known in ("name", "topology", "links", "servers", "rdma", "management", "addressing"):
        assert known in message


# -- hypothesis over bad values ------------------------------------------------------------

FIELDS = set(LabSpec.model_fields)


@settings(max_examples=60, deadline=None)
@given(key=st.from_regex(r"[a-z_]{1,12}", fullmatch=True))
def test_any_unknown_top_level_key(key):
    assume(key not in FIELDS)
    message = assert_one_line(spec_error({**MINIMAL, key: 1}))
    assert message.startswith(f"{SOURCE}: {key}: unknown key"), message


@settings(max_examples=60, deadline=None)
@given(
    n=st.one_of(st.integers(max_value=1), st.integers(min_value=65)),
    k=st.integers(min_value=0, max_value=7),
)
def test_bcube_n_out_of_range(n, k):
    message = assert_one_line(spec_error(with_(topology={"kind": "bcube", "n": n, "k": k})))
    assert message.startswith(f"{SOURCE}: topology.n: "), message


@settings(max_examples=40, deadline=None)
@given(k=st.integers(min_value=1, max_value=31).map(lambda i: 2 * i + 1))
def test_fattree_odd_k(k):
    message = assert_one_line(spec_error(with_(topology={"kind": "fattree", "k": k})))
    assert message.startswith(f"{SOURCE}: topology.k: "), message
    assert "even" in message


@settings(max_examples=40, deadline=None)
@given(
    switches=st.integers(min_value=1, max_value=63).map(lambda i: 2 * i + 1),
    m=st.integers(min_value=1, max_value=128),
)
def test_bigraph_odd_switches(switches, m):
    data = with_(topology={"kind": "bigraph", "switches": switches, "servers_per_switch": m})
    message = assert_one_line(spec_error(data))
    assert message.startswith(f"{SOURCE}: topology.switches: "), message


@settings(max_examples=60, deadline=None)
@given(loss=st.one_of(
    st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False),
    st.floats(min_value=100.001, max_value=1e9, allow_nan=False),
))
def test_loss_out_of_range(loss):
    message = assert_one_line(spec_error(with_(links={"loss": loss})))
    assert message.startswith(f"{SOURCE}: links.loss: "), message


@settings(max_examples=60, deadline=None)
@given(delay=st.integers(0, 1000), extra=st.integers(1, 1000))
def test_jitter_above_delay(delay, extra):
    data = with_(links={"delay": f"{delay}us", "jitter": f"{delay + extra}us"})
    message = assert_one_line(spec_error(data))
    assert "jitter" in message


@settings(max_examples=60, deadline=None)
@given(name=st.from_regex(r"[a-z0-9][a-z0-9-]{0,23}", fullmatch=True))
def test_valid_names_accepted(name):
    assert validate(LabSpec, with_(name=name), SOURCE).name == name


@settings(max_examples=60, deadline=None)
@given(name=st.text(min_size=1, max_size=30))
def test_invalid_names_rejected(name):
    assume(re.fullmatch(r"[a-z0-9][a-z0-9-]{0,23}", name) is None)
    message = assert_one_line(spec_error(with_(name=name)))
    assert message.startswith(f"{SOURCE}: name: "), message


@settings(max_examples=60, deadline=None)
@given(
    data_net=st.integers(1, 223),
    data_len=st.integers(8, 24),
    extra_bits=st.integers(0, 8),
    offset=st.integers(0, 2**24),
)
def test_management_inside_data_pool_rejected(data_net, data_len, extra_bits, offset):
    data = ipaddress.IPv4Network((data_net << 24, data_len))
    mgmt_len = data_len + extra_bits
    index = offset % 2**extra_bits
    mgmt = ipaddress.IPv4Network(
        (int(data.network_address) + (index << (32 - mgmt_len)), mgmt_len))
    assert mgmt.subnet_of(data)
    links = next(ipaddress.IPv4Network(c) for c in ("172.16.0.0/12", "192.0.2.0/24",
                                                       "198.51.100.0/24")
                 if not data.overlaps(ipaddress.IPv4Network(c)))
    message = assert_one_line(spec_error(with_(
        management={"subnet": str(mgmt)}, addressing={"data": str(data), "links": str(links)})))
    assert message.startswith(f"{SOURCE}: management.subnet {mgmt} overlaps addressing.data"), \
        message


# -- files ---------------------------------------------------------------------------------


def test_yaml_syntax_error_names_line_and_column(tmp_path):
    path = write(tmp_path, "name: lab\n\ttopology: {kind: star, servers: 2}\n")
    with pytest.raises(SpecError) as caught:
        load_lab(path)
    message = assert_one_line(caught.value, str(path))
    # the tab that YAML cannot start a token with is line 2, column 1
    assert message.startswith(f"{path}:2:1: "), message
    assert "YAML" in message


def test_yaml_syntax_error_in_a_later_line(tmp_path):
    path = write(tmp_path, "name: lab\ntopology:\n  kind: star\n servers: 2\n")
    with pytest.raises(SpecError) as caught:
        load_lab(path)
    message = assert_one_line(caught.value, str(path))
    match = re.match(re.escape(str(path)) + r":(\d+):(\d+): ", message)
    assert match, message
    assert int(match[1]) == 4  # the badly indented `servers:`


def test_unclosed_flow_mapping(tmp_path):
    path = write(tmp_path, "name: lab\ntopology: {kind: bcube, n: 4\n")
    with pytest.raises(SpecError) as caught:
        load_lab(path)
    message = assert_one_line(caught.value, str(path))
    assert re.match(re.escape(str(path)) + r":\d+:\d+: YAML", message), message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", ["empty"]),
        ("# only a comment\n", ["empty"]),
        ("- name: lab\n- topology: star\n", ["list"]),
        ("just a string\n", ["mapping"]),
        ("42\n", ["mapping"]),
    ],
    ids=["empty", "comment-only", "list", "scalar", "number"],
)
def test_file_that_is_not_a_mapping(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_lab(path)
    message = assert_one_line(caught.value, str(path))
    for word in words:
        assert word in message


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as caught:
        load_lab(path)
    message = assert_one_line(caught.value, str(path))
    assert "no such file" in message


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(SpecError) as caught:
        load_lab(tmp_path)
    message = assert_one_line(caught.value, str(tmp_path))
    assert "directory" in message


def test_undecodable_file(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_bytes(b"name: \xff\xfe\ntopology: {kind: star, servers: 2}\n")
    with pytest.raises(SpecError) as caught:
        load_lab(path)
    assert_one_line(caught.value, str(path))


def test_validation_error_from_file_starts_with_path(tmp_path):
    path = write(tmp_path, "name: lab\ntopology: {kind: bcube, n: 1, k: 1}\n")
    with pytest.raises(SpecError) as caught:
        load_lab(path)
    message = assert_one_line(caught.value, str(path))
    assert message.startswith(f"{path}: topology.n: ")


def test_duplicate_keys_rejected(tmp_path):
    # Regression: read_yaml uses yaml.safe_load, which silently keeps the last of duplicate keys,
    # so a file with two `links:` blocks (or two `name:` lines) loads without complaint and
    # the first block is dropped. YAML requires unique keys; this should be a SpecError
    # naming the file, the line and the key.
    path = write(
        tmp_path,
        "name: lab\ntopology: {kind: star, servers: 2}\n"
        "links: {bandwidth: 100Mbit}\nlinks: {delay: 1ms}\n",
    )
    with pytest.raises(SpecError) as caught:
        load_lab(path)
    message = assert_one_line(caught.value, str(path))
    assert "links" in message


def test_yaml_round_trip_of_a_dumped_spec(tmp_path):
    """A validated spec dumped to YAML (pydantic serialisers) loads back to the same spec."""
    lab = validate(
        LabSpec,
        with_(links={"bandwidth": "100Mbit", "delay": "2ms", "jitter": "1ms", "loss": 0.5},
              servers={"cpus": 0.5, "memory": "512M"},
              management={"subnet": "198.18.5.0/24"}),
        SOURCE,
    )
    path = write(tmp_path, yaml.safe_dump(lab.model_dump(mode="json")))
    assert load_lab(path) == lab
