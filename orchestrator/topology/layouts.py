"""Where each node of a topology goes in a drawing: pure layouts (no matplotlib, no I/O).

Each kind is laid out by its own structure (its registered `layout`, topology/kinds.py) —
BCube levels as rows of switches around the server row, Fat-Tree pods side by side, a torus
as its grid — rather than by a generic force layout, so the picture shows the wiring the
papers draw. Layout units: one unit is the pitch between neighbouring servers;
`Layout.scale` says how many inches a unit should take (draw.py renders it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.topology.model import Link, Topology

Point = tuple[float, float]


@dataclass(frozen=True)
class Edge:
    a: str
    b: str
    group: str  # legend entry; one colour per group
    bulge: float = 0.0  # arcs: sideways offset of the curve's middle, in layout units
    dashed: bool = False
    faint: bool = False  # a secondary dimension, drawn lightly


@dataclass
class Layout:
    pos: dict[str, Point]
    edges: list[Edge]
    scale: tuple[float, float]  # preferred inches per layout unit, in x and y
    equal: bool = False  # grids and circles keep their aspect ratio
    regions: list[tuple[list[str], str]] = field(default_factory=list)  # shaded, captioned
    note: str = ""  # appended to the title
    legend_extra: list[tuple[str, dict]] = field(default_factory=list)  # (label, Line2D kwargs)


# -- layouts ----------------------------------------------------------------------------------
def positions(topology: Topology) -> dict[str, Point]:
    """Where each node goes, in layout units (x right, y up)."""
    return layout(topology).pos


def layout(topology: Topology) -> Layout:
    """The layout its kind registered; kinds without one are laid out as a `graph`."""
    from orchestrator.topology.kinds import kind_of

    chosen = kind_of(topology.kind).layout
    return (chosen or graph)(topology)


def _spread(index: int, count: int, width: float) -> float:
    """x of item `index` of `count` spread evenly over servers at 0 … width-1."""
    return (index + 0.5) * width / count - 0.5


def _mean_x(pos: dict[str, Point], names: list[str]) -> float:
    return sum(pos[name][0] for name in names) / len(names)


def _switch_end(topology: Topology, link: Link) -> tuple[str, str]:
    """(other end, switch end) of a link with at least one switch."""
    a, b = link.nodes()
    return (b, a) if topology.nodes[b].is_server else (a, b)


def bcube(t: Topology) -> Layout:
    # Servers in one row; level 0 below (each switch under its contiguous group), level l
    # at row l above. Upper levels are spread evenly: centring them over their members
    # would pile them all up in the middle, since their members are strided.
    width = len(t.servers)
    pos = {s.name: (float(i), 0.0) for i, s in enumerate(t.servers)}
    groups = t.facts["groups"]
    for sw in t.switches:
        level, index = sw.attrs["level"], sw.attrs["index"]
        if level == 0:
            pos[sw.name] = (_mean_x(pos, groups[0][index]), -1.0)
        else:
            pos[sw.name] = (_spread(index, len(groups[level]), width), float(level))
    edges = []
    for link in t.links:
        server, switch = _switch_end(t, link)
        edges.append(Edge(server, switch, f"level {t.nodes[switch].attrs['level']}"))
    return Layout(pos, edges, scale=(0.8, 1.5))


FATTREE_LAYERS = ["host", "edge", "aggregation", "core"]


def fattree(t: Topology) -> Layout:
    # Hosts grouped by edge switch (small gap) and by pod (large gap); each pod's edge and
    # aggregation switches stand over their hosts; the cores are spread over the whole width.
    k = t.facts["k"]
    half = k // 2
    edge_pitch, pod_gap = half + 0.5, 1.8
    pod_pitch = half * edge_pitch - 0.5 + pod_gap
    width = k * pod_pitch - pod_gap
    pos: dict[str, Point] = {}
    for s in t.servers:
        a = s.attrs
        pos[s.name] = (a["pod"] * pod_pitch + a["edge"] * edge_pitch + a["index"], 0.0)
    # Core links run the whole width: lift the cores with it, or the longest links run so flat
    # that they seem to join neighbouring aggregation switches.
    rows = {"edge": 1.0, "aggregation": 2.0, "core": 2.0 + max(1.5, width / 40)}
    cores = [sw for sw in t.switches if sw.attrs["layer"] == "core"]
    for sw in t.switches:
        a = sw.attrs
        if a["layer"] == "core":
            x = _spread(a["index"], len(cores), width + 1)
        else:
            x = a["pod"] * pod_pitch + a["index"] * edge_pitch + (half - 1) / 2
        pos[sw.name] = (x, rows[a["layer"]])

    def layer(name: str) -> str:
        return "host" if t.nodes[name].is_server else t.nodes[name].attrs["layer"]

    edges = []
    for link in t.links:
        low, high = sorted(link.nodes(), key=lambda n: FATTREE_LAYERS.index(layer(n)))
        edges.append(Edge(low, high, f"{layer(low)}–{layer(high)}"))
    regions = []
    for pod in range(k):
        members = [n for n, node in t.nodes.items() if node.attrs.get("pod") == pod]
        regions.append((members, f"pod {pod}"))
    return Layout(pos, edges, scale=(0.7, 1.3), regions=regions)


def _ring(names: list[str], spacing: float = 1.4) -> dict[str, Point]:
    """Names clockwise from the top on a circle round the origin, `spacing` units apart."""
    radius = max(1.5, len(names) * spacing / (2 * math.pi))
    out = {}
    for i, name in enumerate(names):
        angle = math.pi / 2 - 2 * math.pi * i / len(names)
        out[name] = (radius * math.cos(angle), radius * math.sin(angle))
    return out


def torus(t: Topology) -> Layout:
    k, d = t.facts["k"], t.facts["d"]
    coords = {s.name: s.attrs["coords"] for s in t.servers}
    note, regions = "", []
    if d == 1 or d > 3:
        pos = _ring([s.name for s in t.servers])
        if d > 3:
            note = f"{d}-D torus drawn as a ring in rank order"
    elif d == 2:
        pos = {name: (float(c[0]), float(c[1])) for name, c in coords.items()}
    else:  # one k×k grid per value of the last coordinate, side by side
        pitch = k + 1.5
        pos = {name: (c[0] + c[2] * pitch, float(c[1])) for name, c in coords.items()}
        for z in range(k):
            regions.append(([n for n, c in coords.items() if c[2] == z], f"x2 = {z}"))
    edges = []
    for link in t.links:
        a, b = link.nodes()
        dim = t.nodes[a].interfaces[link.a.interface].level
        wrap = abs(coords[a][dim] - coords[b][dim]) > 1
        group = f"dimension {dim}"
        if d == 1 or d > 3:
            edges.append(Edge(a, b, group))
        elif dim < 2:  # in-grid: straight to the neighbour, an arc around the row for wraps
            edges.append(Edge(a, b, group, bulge=0.3 if wrap else 0.0, dashed=wrap))
        else:  # between grids: arcs clear the rows they run along; wraps curve the other way
            edges.append(Edge(a, b, group, bulge=-0.45 if wrap else 0.45, dashed=wrap, faint=True))
    extra = []
    if 2 <= d <= 3 and k > 2:
        extra = [("wrap-around", {"color": "#555555", "linestyle": (0, (4, 2))})]
    scale = (1.2, 1.2) if d == 2 else (1.3, 1.3) if d == 3 else (0.9, 0.9)
    return Layout(pos, edges, scale, equal=True, regions=regions, note=note, legend_extra=extra)


def _two_tier(
    rows: list[tuple[list[str], float, float]], groups: list[list[str]]
) -> dict[str, Point]:
    """Rows of (switches, switch y, server y): each switch centred on its block of servers.

    `groups` holds the servers of every switch, row after row; blocks are one unit apart.
    """
    pitch = max(len(g) for g in groups) + 1
    pos: dict[str, Point] = {}
    block = iter(groups)
    for switches, y, server_y in rows:
        for i, switch in enumerate(switches):
            servers = next(block)
            for j, server in enumerate(servers):
                pos[server] = (float(i * pitch + j), server_y)
            pos[switch] = (_mean_x(pos, servers), y)
    return pos


def bigraph(t: Topology) -> Layout:
    # Upper switches with their servers above them, lower ones with their servers beneath:
    # the complete bipartite switch links fill the band in between.
    upper, lower = t.facts["upper"], t.facts["lower"]
    pos = _two_tier([(upper, 1.5, 2.5), (lower, 0.0, -1.0)], t.facts["groups"])
    edges = []
    for link in t.links:
        a, b = link.nodes()
        switches = not t.nodes[a].is_server and not t.nodes[b].is_server
        edges.append(Edge(a, b, "upper–lower switch" if switches else "server–switch"))
    return Layout(pos, edges, scale=(1.0, 1.3))


def leafspine(t: Topology) -> Layout:
    leaves = [sw.name for sw in t.switches if sw.attrs["layer"] == "leaf"]
    spines = [sw.name for sw in t.switches if sw.attrs["layer"] == "spine"]
    is_spine = set(spines)
    pos = _two_tier([(leaves, 1.0, 0.0)], t.facts["groups"])
    width = max(x for x, _ in pos.values()) + 1
    for i, spine in enumerate(spines):
        pos[spine] = (_spread(i, len(spines), width), 2.5)
    edges = []
    for link in t.links:
        a, b = link.nodes()
        edges.append(Edge(a, b, "leaf–spine" if {a, b} & is_spine else "server–leaf"))
    return Layout(pos, edges, scale=(0.7, 1.3))


def star(t: Topology) -> Layout:
    pos = _ring([s.name for s in t.servers])
    for sw in t.switches:
        pos[sw.name] = (0.0, 0.0)
    edges = [Edge(*link.nodes(), "server–switch") for link in t.links]
    return Layout(pos, edges, scale=(0.9, 0.9), equal=True)


def graph(t: Topology) -> Layout:
    # Any network: servers on the bottom row, LAN by LAN; each switch one row above the
    # nearest server's, placed over the mean of its neighbours below (barycentre). Links at a
    # rate of their own are dashed.
    order = [name for group in t.facts["groups"] for name in group]
    pos = {name: (float(i), 0.0) for i, name in enumerate(order)}
    neighbours: dict[str, list[str]] = {name: [] for name in t.nodes}
    for link in t.links:
        a, b = link.nodes()
        neighbours[a].append(b)
        neighbours[b].append(a)
    row, frontier = dict.fromkeys(order, 0), list(order)
    while frontier:
        later = []
        for here in frontier:
            for there in neighbours[here]:
                if there not in row:
                    row[there] = row[here] + 1
                    later.append(there)
        frontier = later
    width = max(len(order), 1)
    for level in sorted({r for r in row.values() if r > 0}):
        names = [n for n, r in row.items() if r == level]
        below = {n: [pos[m][0] for m in neighbours[n] if m in pos and row[m] < level] for n in names}
        names.sort(key=lambda n: (sum(below[n]) / len(below[n]) if below[n] else 0.0, n))
        for i, name in enumerate(names):
            pos[name] = (_spread(i, len(names), width), 1.4 * level)
    for name in t.nodes:  # a switch no server reaches: above the rest
        pos.setdefault(name, (0.0, 1.4 * (max(row.values(), default=0) + 1)))
    edges = []
    for link in t.links:
        a, b = link.nodes()
        servers = t.nodes[a].is_server + t.nodes[b].is_server
        kind = ("switch–switch", "server–switch", "server–server")[servers]
        (xa, ya), (xb, yb) = pos[a], pos[b]
        hidden = ya == yb and any(y == ya and min(xa, xb) < x < max(xa, xb) for x, y in pos.values())
        bulge = 0.15 * abs(xb - xa) if hidden else 0.0  # arc over the nodes a straight line would cross
        edges.append(Edge(a, b, kind, bulge=bulge, dashed=(a, b) in t.rates))
    legend = [("link at a rate of its own", {"linestyle": "--", "color": "0.3"})] if t.rates else []
    return Layout(pos, edges, scale=(0.8, 1.2), legend_extra=legend)
