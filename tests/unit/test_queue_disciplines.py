"""Queue disciplines (issue 32): the lab file's forms and refusals (spec/queues.py), the
requests that install them (emulation/queues.py: CoDel's byte for byte what pyroute2 encodes;
RED's parameters as tc derives them), and the marks read back from a qdisc dump."""

from __future__ import annotations

import itertools
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.emulation import kernel, queues
from orchestrator.spec.lab import LinksSpec
from orchestrator.spec.queues import Codel, Red


def links(**fields) -> LinksSpec:
    return LinksSpec.model_validate(fields)


def test_queue_as_a_mapping_is_the_packets_and_a_discipline_and_round_trips():
    spec = links(queue={"packets": 200, "discipline": "red", "min": "30KB", "max": 40, "probability": 0.5})
    assert spec.queue == 200 and isinstance(spec.discipline, Red)
    assert spec.discipline.min.in_bytes(1500) == 30 * 1024 and spec.discipline.max.in_bytes(1500) == 40 * 1500
    assert LinksSpec.model_validate(spec.model_dump(mode="json")) == spec
    assert links(queue=300).discipline.kind == "fifo" and links(queue=300).queue == 300
    codel = links(queue={"discipline": "fq_codel", "ce_threshold": "1ms"}).discipline
    assert isinstance(codel, Codel) and codel.ce_threshold == 0.001 and codel.marks
    assert links(queue={"packets": 50}).queue == 50


@pytest.mark.parametrize("fields, says", [
    ({"queue": {"discipline": "red", "min": 20, "max": 10}}, "swap them"),
    ({"queue": {"discipline": "red", "min": 20, "max": 2000}}, "must stay below the queue's length"),
    ({"queue": {"discipline": "codel"}, "delay": "1ms"}, "keeps netem as its queue"),
    ({"queue": {"discipline": "pie"}}, "'fifo', 'red', 'codel', 'fq_codel'"),
    ({"queue": {"discipline": "red", "min": 20, "max": 20, "target": "1ms"}}, "target"),
    ({"queue": {"discipline": "red", "max": 20}}, "min"),
    ({"queue": {"discipline": "red", "min": 2, "max": 3, "probability": 2}}, "probability"),
    ({"queue": {"discipline": "codel", "ce_threshold": "10s"}}, "ce_threshold"),
    ({"queue": {"discipline": "red", "min": True, "max": 3}}, "packets"),
    ({"queue": {"discipline": "red", "min": 2, "max": 3, "ecn": False, "nodrop": True}}, "needs ecn"),
    # what tc finds no averaging weight for, and what the kernel's fixed point cannot hold
    ({"queue": {"discipline": "red", "min": "1000B", "max": "30KB"}}, "no weight"),
    ({"queue": {"packets": 30000, "discipline": "red", "min": 20, "max": 20000}}, "fixed point"),
    ({"queue": {"discipline": "codel"}, "discipline": {"kind": "red"}}, "give the discipline once"),
])
def test_bad_disciplines_are_refused_naming_the_field(fields, says):
    with pytest.raises((ValidationError, ValueError)) as caught:
        links(**fields)
    assert says in str(caught.value)


@pytest.mark.parametrize("kind, prefix", [("codel", "cdl"), ("fq_codel", "fqc")])
def test_codel_requests_are_what_pyroute2_encodes(kind, prefix):
    discipline = links(queue={"packets": 300, "discipline": kind, "target": "2ms", "interval": "50ms",
                              "ce_threshold": "1ms"}).discipline
    ours = queues.leaf_message(7, "add", discipline, 300, 1500, 10**8)
    batch = kernel.pyroute2().IPBatch()
    try:
        options = {f"{prefix}_limit": 300, f"{prefix}_ecn": 1, f"{prefix}_target": "2ms",
                   f"{prefix}_ce_threshold": "1ms", f"{prefix}_interval": "50ms"}
        batch.tc("add", kind, 7, kernel.LEAF, parent=kernel.HTB_CLASS, **options)
        theirs = bytes(batch.batch)
    finally:
        batch.close()
    assert ours[:8] == theirs[:8] and ours[16:] == theirs[16:], (ours.hex(), theirs.hex())


def tc_request(arguments: str) -> bytes | None:
    """The RTM_NEWQDISC request tc(8) sends for `tc qdisc add dev lo parent 1:1 handle 2:
    ARGUMENTS`, read from strace's dump of what it writes. It runs in a network namespace of
    its own (unshare -n), whose lo has no class 1:1, so the kernel refuses it (or knows no RED
    at all): nothing of this machine's is touched. None: tc computed nothing."""
    with tempfile.TemporaryDirectory() as directory:
        trace = Path(directory) / "trace"
        subprocess.run(["unshare", "-n", "strace", "-e", "trace=sendmsg", "-e", "write=all", "-o", str(trace), "tc",
                        "qdisc", "add",
                        "dev", "lo", "parent", "1:1", "handle", "2:", *arguments.split()],
                       capture_output=True, timeout=30)
        lines = trace.read_text().splitlines()
    for at, line in enumerate(lines):
        if "RTM_NEWQDISC" in line:
            dump = itertools.takewhile(lambda text: text.startswith(" | "), lines[at + 2:])
            return bytes.fromhex("".join(text[10:59] for text in dump))
    return None


needs_tc = pytest.mark.skipif(not (shutil.which("tc") and shutil.which("strace") and os.geteuid() == 0),
                              reason="tc, strace and root (for a namespace of its own) are needed to read tc's own "
                                     "request (apt-get install strace)")


@needs_tc
@pytest.mark.parametrize("packets, low, high, probability, ecn, rate", [
    (200, "30000B", "90000B", 0.1, True, "100Mbit"),
    (200, "30000B", "30000B", 1.0, True, "100Mbit"),   # DCTCP's step at K
    (200, "30KB", "30KB", 1.0, True, "1Gbit"),   # a K tc's default burst cannot take: its advice, burst 21
    (1000, 3, 9, 0.02, False, "10Mbit"),
    (1000, 20, 20, 1.0, "nodrop", "10Mbit"),
    # from 12 Gbit/s on tc counts an MTU's transmit time as 0 us and sends an idle table of zeros (we
    # keep one tick: the average still decays); it takes no rate of 2^32 bytes/s at all
    (100, 5, 60, 0.5, True, "10Gbit"),
])
def test_red_requests_are_what_tc_sends(packets, low, high, probability, ecn, rate):
    spec = links(queue={"packets": packets, "discipline": "red", "min": low, "max": high,
                        "probability": probability, "ecn": bool(ecn), "nodrop": ecn == "nodrop"}, bandwidth=rate)
    red, mtu = spec.discipline, spec.mtu
    ours = queues.leaf_message(1, "add", red, packets, mtu, spec.bandwidth)  # lo is interface 1
    low_b, high_b = red.min.in_bytes(mtu), red.max.in_bytes(mtu)
    burst = (2 * low_b + high_b) // (3 * mtu)
    if burst + 1 - low_b / mtu < 1:
        burst = 1 + low_b // mtu
    theirs = tc_request(f"red limit {packets * mtu} min {low_b} max {high_b} avpkt {mtu} burst {burst} "
                        f"probability {probability:g} bandwidth {spec.bandwidth}bit" + (" ecn" if ecn else "")
                        + (" nodrop" if ecn == "nodrop" else ""))
    assert theirs is not None
    assert ours[:8] == theirs[:8] and ours[16:] == theirs[16:], (ours.hex(), theirs.hex())


def test_red_request_holds_limit_thresholds_flags_and_max_p():
    red = links(queue={"packets": 200, "discipline": "red", "min": 20, "max": 20, "probability": 1}).discipline
    message = queues.leaf_message(3, "replace", red, 200, 1500, 10**8)
    assert struct.unpack_from("=H", message, 6)[0] == kernel.REPLACE
    _, index, handle, parent, _ = struct.unpack_from("=BxxxiIII", message, 16)
    assert (index, handle, parent) == (3, kernel.LEAF, kernel.HTB_CLASS)
    found = kernel.attributes(message, 36)
    assert found[1] == b"red\0"
    options = kernel.attributes(found[2], 0)
    limit, low, high, _, _, _, flags = struct.unpack("=IIIBBBB", options[1])
    assert (limit, low, high, flags) == (200 * 1500, 30000, 30000, 0)
    assert struct.unpack("=II", options[4]) == (1, 0x0F)  # TC_RED_ECN, as a bitfield
    assert len(options[2]) == 256 and struct.unpack("=I", options[3])[0] == 0


def qdisc_message(ifindex: int, handle: int, parent: int, kind: str, xstats: bytes, backlog=0, drops=0) -> bytes:
    queue = struct.pack("=5I", 0, backlog, drops, 0, 0)
    stats2 = kernel._attr(kernel.TCA_STATS_QUEUE, queue) + kernel._attr(kernel.TCA_STATS_APP, xstats)
    body = (struct.pack("=BxxxiIII", 0, ifindex, handle, parent, 0) + kernel._attr(kernel.TCA_KIND, kind.encode() + b"\0")
            + kernel._attr(kernel.TCA_STATS2, stats2) + kernel._attr(kernel.TCA_XSTATS, xstats))
    return kernel._message(36, 0, body)


@pytest.mark.parametrize("kind, xstats, marks", [
    ("red", struct.pack("=4I", 5, 6, 7, 11), 11),
    ("codel", struct.pack("=9I", 1, 2, 3, 4, 5, 6, 7, 8, 9), 7 + 9),
    ("fq_codel", struct.pack("=10I", 0, 1, 2, 3, 4, 5, 6, 7, 8, 9), 3 + 7),
    ("pfifo", b"", 0),
])
def test_marks_are_read_from_the_leaf_and_given_with_the_root_qdiscs_stats(kind, xstats, marks):
    class Dump:
        def dump(self, ns, request, what):
            return [qdisc_message(4, kernel.HTB_ROOT, kernel.TC_H_ROOT, "htb", b"", backlog=3000, drops=2),
                    qdisc_message(4, kernel.LEAF, kernel.HTB_CLASS, kind, xstats)]

    assert kernel.root_qdiscs(Dump(), "ns") == {4: {"drops": 2, "overlimits": 0, "backlog": 3000, "qlen": 0,
                                                     "marks": marks}}


def _experiment(sweep: dict, links: dict | None = None):
    from orchestrator.spec.experiment import ExperimentSpec
    from orchestrator.spec.loader import validate

    lab = {"name": "qs", "topology": {"kind": "star", "servers": 4}, "servers": {"runtime": "netns"},
           "links": {"bandwidth": "10Mbit", **(links or {})}}
    return validate(ExperimentSpec, {"name": "qs", "lab": lab, "sweep": sweep, "agents": {
        "algorithms": ["ring"], "workload": {"kind": "back-to-back", "size": "1MB"}}}, "qs.yaml")


def test_queues_and_congestion_controls_are_sweep_axes():
    """fifo+cubic beside red+dctcp in one file: each a lab variant, named in its points' ids
    and results, and told apart by compare and the plots."""
    from orchestrator.experiment import compare, plots
    from orchestrator.experiment.sweep import expand

    red = {"packets": 500, "discipline": "red", "min": 20, "max": 20, "nodrop": True}
    points = expand(_experiment({"queues": [1000, red, {"discipline": "fq_codel", "ce_threshold": "1ms"}],
                                 "tcp_congestion": ["cubic", "dctcp"]}))
    assert [p.id for p in points] == [
        "000-star-4-10mbit-fifo1000-cubic-1mib-ring", "001-star-4-10mbit-fifo1000-dctcp-1mib-ring",
        "002-star-4-10mbit-red20-20-q500-nodrop-cubic-1mib-ring", "003-star-4-10mbit-red20-20-q500-nodrop-dctcp-1mib-ring",
        "004-star-4-10mbit-fq_codel-ce1ms-cubic-1mib-ring", "005-star-4-10mbit-fq_codel-ce1ms-dctcp-1mib-ring"]
    labs = [p.lab for p in points]
    assert [(lab.links.queue, lab.links.discipline.kind, lab.servers.tcp_congestion) for lab in labs] == [
        (1000, "fifo", "cubic"), (1000, "fifo", "dctcp"), (500, "red", "cubic"), (500, "red", "dctcp"),
        (1000, "fq_codel", "cubic"), (1000, "fq_codel", "dctcp")]
    assert len({lab.name for lab in labs}) == 6
    described = [p.describe() for p in points]
    assert described[3]["queue"] == "red20-20-q500-nodrop" and described[3]["tcp_congestion"] == "dctcp"
    assert len({compare.key(d) for d in described}) == 6
    assert {"queue", "tcp_congestion"} <= plots._varied(described)
    # an experiment without those axes describes its points as before (old results compare)
    plain = expand(_experiment({}))[0].describe()
    assert "queue" not in plain and "tcp_congestion" not in plain


@pytest.mark.parametrize("sweep, links, says", [
    ({"queues": [{"discipline": "red", "min": 20, "max": 2000}]}, None, "sweep.queues.0"),
    ({"queues": [{"packets": 10, "discipline": "red", "min": 20, "max": 20}]}, None, "10 packets"),
    ({"queues": [{"discipline": "red", "min": 20, "max": 30}]},
     {"overrides": [{"link": "h0-sw", "queue": 25}]}, "on h0-sw"),
    ({"queues": [{"discipline": "codel"}]}, {"delay": "1ms"}, "keeps netem"),
    ({"tcp_congestion": ["DCTCP"]}, None, "sweep.tcp_congestion"),
    ({"queues": [{"packets": 100, "discipline": "red", "min": 20, "max": 20},
                 {"packets": 100, "discipline": "red", "min": 20, "max": 20, "probability": 1}]}, None, "give each once"),
])
def test_a_sweep_queue_the_lab_cannot_take_is_refused_in_one_line(sweep, links, says):
    from orchestrator.errors import SpecError

    with pytest.raises(SpecError) as caught:
        _experiment(sweep, links)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_queue_labels_tell_apart_every_setting_that_differs():
    from pydantic import TypeAdapter

    from orchestrator.spec.queues import Setting

    labels = [TypeAdapter(Setting).validate_python(value).label for value in (
        1000, {"discipline": "fifo"}, {"packets": 100, "discipline": "red", "min": 20, "max": 20},
        {"packets": 1000, "discipline": "red", "min": 20, "max": 20},
        {"discipline": "red", "min": 20, "max": 20, "probability": 0.5},
        {"discipline": "red", "min": 20, "max": 20, "ecn": False},
        {"discipline": "red", "min": 20, "max": 20, "nodrop": True},
        {"discipline": "codel"}, {"discipline": "codel", "target": "2ms"}, {"discipline": "fq_codel", "ce_threshold": "1ms"},
        {"discipline": "fq_codel", "interval": "50ms"})]
    assert len(set(labels)) == len(labels), labels
    assert all(label == label.lower() and " " not in label for label in labels)


def test_a_swept_value_another_axis_cannot_take_is_one_line_not_a_traceback():
    """A RED queue fits the lab's own star, not a graph of the sweep whose link has a queue of
    its own below RED's max: the plan says which lab and why."""
    from orchestrator.errors import SpecError
    from orchestrator.experiment.sweep import variants

    graph = {"kind": "graph", "servers": ["a", "b"], "l2": ["s"], "links": [["a", "s"], {"a": "b", "b": "s", "queue": 10}]}
    spec = _experiment({"topologies": [{"kind": "star", "servers": 2}, graph]},
                       {"queue": {"discipline": "red", "min": 20, "max": 20}})
    with pytest.raises(SpecError) as caught:
        variants(spec)
    message = str(caught.value)
    assert "\n" not in message and "qs-v1" in message and "red's max" in message, message


def test_a_counter_that_started_again_counts_what_it_counted_since():
    """A fault's heal replaces a marking queue: its counters start from 0 again."""
    from orchestrator.experiment.runner import _delta

    assert _delta({"a→b": 500, "b→a": 10}, {"a→b": 120, "b→a": 30, "c→d": 5}) == {"a→b": 120, "b→a": 20}


@pytest.mark.parametrize("congestion, ecn, asked", [
    ("cubic", None, False), ("dctcp", None, True), ("cubic", True, True), ("dctcp", False, False)])
def test_servers_ask_for_ecn_with_dctcp_or_when_told(congestion, ecn, asked):
    from types import SimpleNamespace

    from orchestrator.emulation.lab import Lab
    from orchestrator.spec import lab_from_argument

    spec = lab_from_argument("star,2", name="ecn", **{"servers.tcp_congestion": congestion, "servers.ecn": ecn})
    lab = SimpleNamespace(spec=spec, topology=SimpleNamespace(nodes={"h0": SimpleNamespace(is_server=True)}))
    metrics = Lab.route_metrics(lab, "h0")
    assert metrics.ecn is asked and metrics.congestion == congestion
    assert ("features ecn" in str(metrics)) is asked
