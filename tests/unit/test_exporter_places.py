"""Where the fabric exporter places each link (its `tier` and `pod` labels), per topology:
what the Grafana fabric dashboard groups utilisation by."""

from __future__ import annotations

from collections import Counter

import pytest

from orchestrator.monitoring.exporter import link_place
from orchestrator.spec import lab_from_argument
from orchestrator.topology import from_lab


def places(argument: str) -> Counter:
    topology = from_lab(lab_from_argument(argument))
    return Counter(link_place(topology, link) for link in topology.links)


def test_fattree_links_by_layer_and_pod():
    counted = places("fattree,4")
    tiers = Counter(tier for tier, _ in counted.elements())
    assert tiers == {"host-edge": 16, "edge-aggregation": 16, "aggregation-core": 16}
    # every link has a pod: a core link counts for the pod of its aggregation switch
    assert Counter(pod for _, pod in counted.elements()) == {str(p): 12 for p in range(4)}


@pytest.mark.parametrize("argument, expected", [
    ("bcube,4,1", {("level0", ""): 16, ("level1", ""): 16}),
    ("torus,3,2", {("level0", ""): 9, ("level1", ""): 9}),
    ("star,4", {("host-switch", ""): 4}),
    ("leafspine,2,2,2", {("host-leaf", ""): 4, ("leaf-spine", ""): 4}),
])
def test_levels_and_layers(argument, expected):
    assert places(argument) == expected


def test_bigraph_halves():
    counted = places("bigraph,4,2")
    assert counted == {("host-upper", ""): 4, ("host-lower", ""): 4, ("lower-upper", ""): 4}
