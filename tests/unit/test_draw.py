"""Topology drawings: every kind renders a PNG, and each layout shows its kind's structure."""

from __future__ import annotations

import math
from statistics import mean

import matplotlib.image as mpimg
import numpy as np
import pytest

from orchestrator import topology
from orchestrator.spec.lab import (
    BCubeSpec,
    BiGraphSpec,
    FatTreeSpec,
    LeafSpineSpec,
    StarSpec,
    TorusSpec,
)
from orchestrator.topology import draw as drawing
from orchestrator.topology.draw import default_title, draw, positions

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SPECS = {
    "bcube-4-1": BCubeSpec(kind="bcube", n=4, k=1),
    "bcube-3-2": BCubeSpec(kind="bcube", n=3, k=2),
    "fattree-4": FatTreeSpec(kind="fattree", k=4),
    "fattree-8": FatTreeSpec(kind="fattree", k=8),
    "torus-4x4": TorusSpec(kind="torus", k=4, d=2),
    "torus-3^3": TorusSpec(kind="torus", k=3, d=3),
    "torus-5": TorusSpec(kind="torus", k=5, d=1),
    "bigraph-4x2": BiGraphSpec(kind="bigraph", switches=4, servers_per_switch=2),
    "leafspine-4-2-4": LeafSpineSpec(kind="leafspine", leaves=4, spines=2, servers_per_leaf=4),
    "star-8": StarSpec(kind="star", servers=8),
}
# Degenerate sizes: each must still lay out and render.
EDGE_CASES = {
    "bcube-k0": BCubeSpec(kind="bcube", n=4, k=0),
    "fattree-2": FatTreeSpec(kind="fattree", k=2),
    "torus-2x2": TorusSpec(kind="torus", k=2, d=2),
    "torus-2^4": TorusSpec(kind="torus", k=2, d=4),
    "bigraph-2x1": BiGraphSpec(kind="bigraph", switches=2, servers_per_switch=1),
    "leafspine-1-1-1": LeafSpineSpec(kind="leafspine", leaves=1, spines=1, servers_per_leaf=1),
    "star-1": StarSpec(kind="star", servers=1),
}


def build(spec):
    return topology.build(spec)


def by_layer(topo, attr: str) -> dict:
    out: dict = {}
    for node in topo.switches:
        out.setdefault(node.attrs[attr], []).append(node.name)
    return out


def ys(pos, names) -> set[float]:
    return {pos[n][1] for n in names}


# -- rendering --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SPECS) + list(EDGE_CASES))
def test_draw_writes_a_png(tmp_path, name):
    spec = SPECS.get(name) or EDGE_CASES[name]
    out = draw(build(spec), tmp_path / f"{name}.png")
    assert out == tmp_path / f"{name}.png"
    assert out.read_bytes()[:8] == PNG_MAGIC
    height, width = mpimg.imread(out).shape[:2]
    assert 200 <= height <= 31 * drawing.DPI
    assert 300 <= width <= 41 * drawing.DPI  # at most ~40 inches, whatever the size


def test_draw_accepts_a_string_path_and_a_title(tmp_path):
    out = draw(build(SPECS["star-8"]), str(tmp_path / "star.png"), title="Control case")
    assert out.exists() and out.read_bytes()[:8] == PNG_MAGIC


def test_bigger_topologies_get_bigger_figures(tmp_path):
    small = mpimg.imread(draw(build(SPECS["fattree-4"]), tmp_path / "a.png")).shape
    large = mpimg.imread(draw(build(SPECS["fattree-8"]), tmp_path / "b.png")).shape
    assert large[1] > 1.5 * small[1]


def test_default_title_counts_the_topology():
    bcube = default_title(build(SPECS["bcube-4-1"]))
    assert bcube == "BCube n=4 k=1: 16 servers, 8 switches, 32 links"
    assert default_title(build(SPECS["torus-4x4"])) == "Torus k=4 d=2: 16 servers, 32 links"
    assert default_title(build(SPECS["star-8"])) == "Star: 8 servers, 1 switch, 8 links"


@pytest.mark.parametrize("name", ["fattree-8", "bcube-3-2", "torus-3^3", "bigraph-4x2"])
def test_labels_are_legible_and_never_overlap(name):
    topo = build(SPECS[name])
    lay = drawing.layout(topo)
    sx, sy, boxes = drawing.fit(topo, lay)
    assert all(size >= 7 for size, *_ in boxes.values())
    inches = np.array([(lay.pos[n][0] * sx, lay.pos[n][1] * sy) for n in lay.pos])
    assert not drawing._overlap(inches, [boxes[n] for n in lay.pos])


def test_crowded_hosts_get_rotated_labels():
    topo = build(SPECS["fattree-8"])
    _, _, boxes = drawing.fit(topo, drawing.layout(topo))
    assert {boxes[s.name][1] for s in topo.servers} == {90}
    assert {boxes[s.name][1] for s in topo.switches} == {0}


# -- layouts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SPECS) + list(EDGE_CASES))
def test_every_node_has_its_own_place(name):
    topo = build(SPECS.get(name) or EDGE_CASES[name])
    pos = positions(topo)
    assert set(pos) == set(topo.nodes)
    spots = [(round(x, 6), round(y, 6)) for x, y in pos.values()]
    assert len(set(spots)) == len(spots)


@pytest.mark.parametrize("name", ["bcube-4-1", "bcube-3-2", "bcube-k0"])
def test_bcube_levels_are_rows_around_the_servers(name):
    topo = build(SPECS.get(name) or EDGE_CASES[name])
    pos, groups, k = positions(topo), topo.facts["groups"], topo.facts["k"]
    servers = [s.name for s in topo.servers]
    assert ys(pos, servers) == {0.0}
    xs = [pos[s][0] for s in servers]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)  # one row, in numeric order
    levels = by_layer(topo, "level")
    assert sorted(levels) == list(range(k + 1))
    rows = {level: ys(pos, names) for level, names in levels.items()}
    assert all(len(r) == 1 for r in rows.values())  # each level is one row
    row_y = {level: r.pop() for level, r in rows.items()}
    assert row_y[0] < 0  # level 0 below the servers
    assert [row_y[level] for level in range(1, k + 1)] == sorted(
        y for level, y in row_y.items() if level > 0
    )
    assert all(row_y[level] > 0 for level in range(1, k + 1))  # the others above, in order
    for index, members in enumerate(groups[0]):
        switch = next(n for n in levels[0] if topo.nodes[n].attrs["index"] == index)
        assert pos[switch][0] == pytest.approx(mean(pos[m][0] for m in members))
    for level, names in levels.items():  # switches of a level in index order
        ordered = sorted(names, key=lambda n: topo.nodes[n].attrs["index"])
        assert [pos[n][0] for n in ordered] == sorted(pos[n][0] for n in names)


def test_bcube_k0_is_one_switch_under_all_servers():
    topo = build(EDGE_CASES["bcube-k0"])
    pos = positions(topo)
    (switch,) = topo.switches
    assert pos[switch.name][0] == pytest.approx(mean(pos[s.name][0] for s in topo.servers))


@pytest.mark.parametrize("name", ["fattree-4", "fattree-8", "fattree-2"])
def test_fattree_layers_stack_and_pods_sit_side_by_side(name):
    topo = build(SPECS.get(name) or EDGE_CASES[name])
    pos, k = positions(topo), topo.facts["k"]
    layers = by_layer(topo, "layer")
    hosts = [s.name for s in topo.servers]
    assert min(ys(pos, layers["core"])) > max(ys(pos, layers["aggregation"]))
    assert min(ys(pos, layers["aggregation"])) > max(ys(pos, layers["edge"]))
    assert min(ys(pos, layers["edge"])) > max(ys(pos, hosts))
    pods = [[h for h in hosts if topo.nodes[h].attrs["pod"] == p] for p in range(k)]
    for left, right in zip(pods, pods[1:]):
        assert max(pos[h][0] for h in left) + 1 < min(pos[h][0] for h in right)  # a gap
    for group, edge in zip(topo.facts["groups"], sorted(layers["edge"], key=lambda n: (
            topo.nodes[n].attrs["pod"], topo.nodes[n].attrs["index"]))):
        assert pos[edge][0] == pytest.approx(mean(pos[h][0] for h in group))
    for agg in layers["aggregation"]:  # over its own pod's hosts
        pod = pods[topo.nodes[agg].attrs["pod"]]
        assert min(pos[h][0] for h in pod) <= pos[agg][0] <= max(pos[h][0] for h in pod)


def test_torus_2d_is_a_grid_with_unit_neighbours():
    topo = build(SPECS["torus-4x4"])
    pos, k = positions(topo), topo.facts["k"]
    for s in topo.servers:
        assert pos[s.name] == pytest.approx(s.attrs["coords"])
    for link in topo.links:
        a, b = link.nodes()
        (ax, ay), (bx, by) = pos[a], pos[b]
        distance = abs(ax - bx) + abs(ay - by)
        assert ax == bx or ay == by  # along a grid line
        assert distance == pytest.approx(1) or distance == pytest.approx(k - 1)  # or a wrap


def test_torus_2d_wraps_are_drawn_as_arcs():
    lay = drawing.layout(build(SPECS["torus-4x4"]))
    wraps = [e for e in lay.edges if e.dashed]
    assert len(wraps) == 2 * 4 and all(e.bulge for e in wraps)
    assert not any(e.bulge for e in lay.edges if not e.dashed)


def test_torus_3d_is_grids_side_by_side():
    topo = build(SPECS["torus-3^3"])
    pos, k = positions(topo), topo.facts["k"]
    grids = [[s.name for s in topo.servers if s.attrs["coords"][2] == z] for z in range(k)]
    for left, right in zip(grids, grids[1:]):
        assert max(pos[n][0] for n in left) < min(pos[n][0] for n in right)
    for link in topo.links:
        a, b = link.nodes()
        ca, cb = topo.nodes[a].attrs["coords"], topo.nodes[b].attrs["coords"]
        if ca[2] == cb[2] and max(abs(x - y) for x, y in zip(ca, cb)) == 1:
            assert math.dist(pos[a], pos[b]) == pytest.approx(1)


@pytest.mark.parametrize("spec", [SPECS["torus-5"], EDGE_CASES["torus-2^4"], SPECS["star-8"]])
def test_rings_put_servers_on_a_circle(spec):
    topo = build(spec)
    pos = positions(topo)
    servers = [s.name for s in topo.servers]
    cx, cy = mean(pos[n][0] for n in servers), mean(pos[n][1] for n in servers)
    radii = [math.dist(pos[n], (cx, cy)) for n in servers]
    assert max(radii) == pytest.approx(min(radii)) and min(radii) > 0
    steps = [math.dist(pos[a], pos[b]) for a, b in zip(servers, servers[1:] + servers[:1])]
    assert max(steps) == pytest.approx(min(steps))  # in rank order, evenly
    for switch in topo.switches:  # the star's switch sits in the middle
        assert pos[switch.name] == pytest.approx((cx, cy))


def test_torus_beyond_3d_says_how_it_is_drawn():
    assert "ring" in drawing.layout(build(EDGE_CASES["torus-2^4"])).note


@pytest.mark.parametrize("spec", [SPECS["bigraph-4x2"], EDGE_CASES["bigraph-2x1"],
                                  BiGraphSpec(kind="bigraph", switches=8, servers_per_switch=4)])
def test_bigraph_halves_face_each_other(spec):
    topo = build(spec)
    pos = positions(topo)
    upper, lower = topo.facts["upper"], topo.facts["lower"]
    assert min(ys(pos, upper)) > max(ys(pos, lower))
    for switch, servers in zip(upper + lower, topo.facts["groups"]):
        assert pos[switch][0] == pytest.approx(mean(pos[s][0] for s in servers))
        if switch in upper:
            assert min(ys(pos, servers)) > pos[switch][1]
        else:
            assert max(ys(pos, servers)) < pos[switch][1]
    xs = [pos[s][0] for s in upper]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)


def test_leafspine_spines_over_leaves_over_servers():
    topo = build(SPECS["leafspine-4-2-4"])
    pos = positions(topo)
    layers = by_layer(topo, "layer")
    servers = [s.name for s in topo.servers]
    assert min(ys(pos, layers["spine"])) > max(ys(pos, layers["leaf"])) > max(ys(pos, servers))
    for i, group in enumerate(topo.facts["groups"]):
        assert pos[f"l{i}"][0] == pytest.approx(mean(pos[s][0] for s in group))
