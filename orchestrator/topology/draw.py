"""Structural drawings of a topology: the figure a researcher puts on a slide.

Each kind is laid out by its own structure — BCube levels as rows of switches around the
server row, Fat-Tree pods side by side, a torus as its grid — rather than by a generic force
layout, so the picture shows the wiring the papers draw. `positions()` is the pure layout
(what the tests check); `draw()` renders it into a PNG with matplotlib's Agg canvas.

Layout units: one unit is the pitch between neighbouring servers; `Layout.scale` says how
many inches a unit should take, and `draw()` shrinks that (within figure-size bounds) and
picks label fonts and rotations so that no two node labels overlap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Patch, PathPatch
from matplotlib.path import Path as MplPath
from matplotlib.textpath import TextPath

from orchestrator.topology.model import Link, Topology

Point = tuple[float, float]

DPI = 120
MAX_WIDTH, MAX_HEIGHT = 40.0, 30.0  # figure bounds, inches
PAD = 0.9  # most inches the axes need around the outermost node centres (boxes, captions)
MARGIN, TOP, BOTTOM = 0.2, 0.7, 0.6  # inches of figure around the axes: title, legend
MAX_LABELLED = 600  # beyond this, labels cannot be legible anyway: draw plain markers
KIND_NAMES = {
    "bcube": "BCube", "fattree": "Fat-Tree", "torus": "Torus",
    "bigraph": "BiGraph", "leafspine": "Leaf-spine", "star": "Star", "graph": "Graph",
}
LINK_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"]
NODE_STYLE = {  # servers: pale rounded boxes; switches: dark square boxes with white text
    "server": {"fc": "#e3eefa", "ec": "#2b6cb0", "text": "#1a365d", "box": "round",
               "weight": "normal"},
    "switch": {"fc": "#3c4a5c", "ec": "#1a202c", "text": "white", "box": "square",
               "weight": "bold"},
}
# Label styles to try, most legible first: horizontal while it fits, then rotated 90 degrees.
LABEL_STYLES = [(11, 0), (10, 0), (9, 0), (8, 0), (9, 90), (8, 90), (7, 90), (6, 90), (5, 90)]
BOX_PAD = 0.25  # bbox padding, in font sizes (matplotlib's own unit for it)
MARKER = (0, 0, 0.12, 0.12)  # the "box" of an unlabelled node: a small marker


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
    builders = {
        "bcube": _bcube, "fattree": _fattree, "torus": _torus,
        "bigraph": _bigraph, "leafspine": _leafspine, "star": _star, "graph": _graph,
    }
    if topology.kind not in builders:
        raise ValueError(f"no drawing for topology kind {topology.kind!r}")
    return builders[topology.kind](topology)


def _spread(index: int, count: int, width: float) -> float:
    """x of item `index` of `count` spread evenly over servers at 0 … width-1."""
    return (index + 0.5) * width / count - 0.5


def _mean_x(pos: dict[str, Point], names: list[str]) -> float:
    return sum(pos[name][0] for name in names) / len(names)


def _switch_end(topology: Topology, link: Link) -> tuple[str, str]:
    """(other end, switch end) of a link with at least one switch."""
    a, b = link.nodes()
    return (b, a) if topology.nodes[b].is_server else (a, b)


def _bcube(t: Topology) -> Layout:
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


def _fattree(t: Topology) -> Layout:
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


def _torus(t: Topology) -> Layout:
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


def _bigraph(t: Topology) -> Layout:
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


def _leafspine(t: Topology) -> Layout:
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


def _star(t: Topology) -> Layout:
    pos = _ring([s.name for s in t.servers])
    for sw in t.switches:
        pos[sw.name] = (0.0, 0.0)
    edges = [Edge(*link.nodes(), "server–switch") for link in t.links]
    return Layout(pos, edges, scale=(0.9, 0.9), equal=True)


def _graph(t: Topology) -> Layout:
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
        kind = "server–switch" if t.nodes[a].is_server or t.nodes[b].is_server else "switch–switch"
        edges.append(Edge(a, b, kind, dashed=(a, b) in t.rates))
    legend = [("link at a rate of its own", {"linestyle": "--", "color": "0.3"})] if t.rates else []
    return Layout(pos, edges, scale=(0.8, 1.2), legend_extra=legend)


# -- rendering --------------------------------------------------------------------------------
def default_title(topology: Topology) -> str:
    """E.g. "BCube n=4 k=1: 16 servers, 8 switches, 32 links"."""
    params = " ".join(f"{key}={value}" for key, value in topology.params.items()
                      if key != "servers")  # a star's only parameter: the count says it
    counts = [(len(topology.servers), "server"), (len(topology.switches), "switch"),
              (len(topology.links), "link")]
    parts = [f"{n} {word}{'es' if word == 'switch' else 's'}" if n != 1 else f"1 {word}"
             for n, word in counts if n or word != "switch"]
    name = f"{KIND_NAMES.get(topology.kind, topology.kind)} {params}".strip()
    return f"{name}: {', '.join(parts)}"


def draw(topology: Topology, path: str | Path, title: str | None = None) -> Path:
    """Write a PNG of `topology` laid out by its structure; returns the path written."""
    path = Path(path)
    lay = layout(topology)
    xs, ys = _extent(lay)
    sx, sy, boxes = fit(topology, lay)
    # Room around the outermost centres: half the largest box, plus region captions.
    pad_x = max(b[2] for b in boxes.values()) / 2 + 0.2
    pad_y = max(b[3] for b in boxes.values()) / 2 + (0.5 if lay.regions else 0.2)
    ax_w = (max(xs) - min(xs)) * sx + 2 * pad_x
    ax_h = (max(ys) - min(ys)) * sy + 2 * pad_y
    width, height = ax_w + 2 * MARGIN, ax_h + TOP + BOTTOM

    fig = Figure(figsize=(width, height), dpi=DPI)  # no pyplot: nothing global to close
    FigureCanvasAgg(fig)
    ax = fig.add_axes((MARGIN / width, BOTTOM / height, ax_w / width, ax_h / height))
    ax.axis("off")
    ax.set_xlim(min(xs) - pad_x / sx, max(xs) + pad_x / sx)
    ax.set_ylim(min(ys) - pad_y / sy, max(ys) + pad_y / sy)

    colours = _draw_edges(ax, lay)
    _draw_regions(ax, lay, boxes, sx, sy)
    _draw_nodes(ax, topology, lay, boxes)

    text_size = min(22.0, max(13.0, width * 0.5))
    heading = title or default_title(topology)
    if lay.note:
        heading += f"\n({lay.note})"
    fig.text(0.5, 1 - (TOP - 0.1) / height, heading, ha="center", va="bottom", fontsize=text_size)
    handles = [Patch(facecolor=NODE_STYLE[r]["fc"], edgecolor=NODE_STYLE[r]["ec"], label=r)
               for r in ("server", "switch") if any(n.role == r for n in topology.nodes.values())]
    handles += [Line2D([], [], color=c, lw=2.5, label=g) for g, c in colours.items()]
    handles += [Line2D([], [], lw=2, label=label, **style) for label, style in lay.legend_extra]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False,
               fontsize=text_size * 0.75, bbox_to_anchor=(0.5, (BOTTOM - 0.1) / height))
    # Tight: a title or legend wider than a small drawing still fits in the picture.
    fig.savefig(path, dpi=DPI, facecolor="white", bbox_inches="tight", pad_inches=0.2)
    return path


def fit(topology: Topology, lay: Layout) -> tuple[float, float, dict[str, tuple]]:
    """Inches per unit in x and y, and each node's label box (see `_label_boxes`)."""
    xs, ys = _extent(lay)
    sx, sy = _scale(lay, max(xs) - min(xs), max(ys) - min(ys))
    return sx, sy, _label_boxes(topology, lay, sx, sy)


def _extent(lay: Layout) -> tuple[list[float], list[float]]:
    """x and y of everything drawn: the nodes and the middles of the arcs."""
    points = list(lay.pos.values()) + [_arc_peak(lay, e) for e in lay.edges if e.bulge]
    return [x for x, _ in points], [y for _, y in points]


def _scale(lay: Layout, span_x: float, span_y: float) -> Point:
    """Inches per layout unit in x and y: the layout's preference, shrunk to the size bounds."""
    sx, sy = lay.scale
    if span_x:
        sx = min(sx, (MAX_WIDTH - 2 * (PAD + MARGIN)) / span_x)
    if span_y:
        sy = min(sy, (MAX_HEIGHT - 2 * PAD - TOP - BOTTOM) / span_y)
    if lay.equal:
        sx = sy = min(sx, sy)
    return sx, sy


def _label_boxes(topology: Topology, lay: Layout, sx: float, sy: float) -> dict[str, tuple]:
    """Per node (font size, rotation, box width, box height in inches); size 0 = marker only.

    One style per role, the most legible one under which no two boxes overlap.
    """
    names = list(lay.pos)
    if len(names) > MAX_LABELLED:
        return {n: MARKER for n in names}
    xy = np.array([(lay.pos[n][0] * sx, lay.pos[n][1] * sy) for n in names])
    widths = {}  # label ink width per point of font size, measured once
    for n in names:
        weight = NODE_STYLE[topology.nodes[n].role]["weight"]
        ink = TextPath((0, 0), n, size=10, prop=FontProperties(weight=weight)).get_extents()
        widths[n] = ink.width / 10
    chosen: dict[str, tuple] = {}
    for role in ("switch", "server"):  # switches are fewer and sparser: they get a style first
        members = [n for n in names if topology.nodes[n].role == role]
        for size, rotation in LABEL_STYLES + [(0, 0)]:
            trial = {n: _box(widths[n], size, rotation) for n in members}
            if size == 0 or not _overlap(xy, [trial.get(n) or chosen.get(n) for n in names]):
                chosen.update(trial)
                break
    return chosen


def _box(width_per_pt: float, size: float, rotation: int) -> tuple:
    if size == 0:
        return MARKER
    w = (width_per_pt + 2 * BOX_PAD) * size / 72 + 0.04
    h = (1.2 + 2 * BOX_PAD) * size / 72
    return (size, rotation, w, h) if rotation == 0 else (size, rotation, h, w)


def _overlap(xy: np.ndarray, boxes: list[tuple | None]) -> bool:
    """Whether any two boxes (None: not yet styled, ignored) come closer than a hair."""
    known = [i for i, b in enumerate(boxes) if b is not None]
    if len(known) < 2:
        return False
    p = xy[known]
    wh = np.array([boxes[i][2:] for i in known])
    gap = 0.06  # inches of air between neighbouring labels
    close_x = np.abs(p[:, None, 0] - p[None, :, 0]) < (wh[:, None, 0] + wh[None, :, 0]) / 2 + gap
    close_y = np.abs(p[:, None, 1] - p[None, :, 1]) < (wh[:, None, 1] + wh[None, :, 1]) / 2 + gap
    hit = close_x & close_y
    np.fill_diagonal(hit, False)
    return bool(hit.any())


def _arc_peak(lay: Layout, edge: Edge) -> Point:
    """The middle of an arc: the axes must hold it too."""
    vertices = _arc(lay.pos[edge.a], lay.pos[edge.b], edge.bulge).vertices
    (px, py), (cx, cy), (qx, qy) = vertices
    return ((px + 2 * cx + qx) / 4, (py + 2 * cy + qy) / 4)


def _arc(p: Point, q: Point, bulge: float) -> MplPath:
    """A quadratic curve from p to q whose middle sits `bulge` units off the straight line.

    Measured from the left end (the lower one if vertical), positive bulges go to the left of
    the direction of travel: up for a horizontal arc, left for a vertical one.
    """
    if (q[0], q[1]) < (p[0], p[1]):
        p, q = q, p
    dx, dy = q[0] - p[0], q[1] - p[1]
    length = math.hypot(dx, dy) or 1.0
    mx, my = (p[0] + q[0]) / 2, (p[1] + q[1]) / 2
    control = (mx - dy / length * 2 * bulge, my + dx / length * 2 * bulge)
    return MplPath([p, control, q], [MplPath.MOVETO, MplPath.CURVE3, MplPath.CURVE3])


def _draw_edges(ax, lay: Layout) -> dict[str, str]:
    """Draw the links; returns the colour of each link group, in legend order."""
    colours: dict[str, str] = {}
    for edge in lay.edges:
        colours.setdefault(edge.group, LINK_COLOURS[len(colours) % len(LINK_COLOURS)])
    n = len(lay.edges)
    width = 1.8 if n <= 64 else 1.2 if n <= 200 else 0.8
    straight: dict[tuple, list] = {}  # one collection per style: thousands of links stay fast
    for edge in lay.edges:
        key = (edge.group, edge.dashed, edge.faint)
        style = {
            "color": colours[edge.group],
            "lw": width * (0.8 if edge.faint else 1.0),
            "alpha": 0.35 if edge.faint else 0.75,
            "linestyle": (0, (4, 2)) if edge.dashed else "-",
            "zorder": 1,
        }
        p, q = lay.pos[edge.a], lay.pos[edge.b]
        if edge.bulge:
            ax.add_patch(PathPatch(_arc(p, q, edge.bulge), fill=False, **style))
        else:
            straight.setdefault(key, [style, []])[1].append([p, q])
    for style, segments in straight.values():
        ax.add_collection(LineCollection(segments, capstyle="round", **style))
    return colours


def _draw_regions(ax, lay: Layout, boxes: dict[str, tuple], sx: float, sy: float) -> None:
    """Shade each group of nodes (a pod, a grid) and caption it underneath."""
    margin = 0.12  # inches around the members' boxes
    for members, caption in lay.regions:
        x0 = min(lay.pos[n][0] - (boxes[n][2] / 2 + margin) / sx for n in members)
        x1 = max(lay.pos[n][0] + (boxes[n][2] / 2 + margin) / sx for n in members)
        y0 = min(lay.pos[n][1] - (boxes[n][3] / 2 + margin) / sy for n in members)
        y1 = max(lay.pos[n][1] + (boxes[n][3] / 2 + margin) / sy for n in members)
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0",
                                    fc="#f2f2f2", ec="#c8c8c8", lw=1, zorder=0))
        ax.text((x0 + x1) / 2, y0 - 0.06 / sy, caption, ha="center", va="top", zorder=2,
                fontsize=11, color="#444444", fontweight="bold",
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.85})


def _draw_nodes(ax, topology: Topology, lay: Layout, boxes: dict[str, tuple]) -> None:
    for name, (x, y) in lay.pos.items():
        style = NODE_STYLE[topology.nodes[name].role]
        size, rotation = boxes[name][:2]
        if size == 0:
            marker = "o" if topology.nodes[name].is_server else "s"
            ax.plot([x], [y], marker=marker, ms=5, mfc=style["fc"], mec=style["ec"], zorder=3)
            continue
        ax.text(x, y, name, ha="center", va="center", rotation=rotation, fontsize=size,
                color=style["text"], fontweight=style["weight"], zorder=3,
                bbox={"boxstyle": f"{style['box']},pad={BOX_PAD}", "fc": style["fc"],
                      "ec": style["ec"], "lw": 1})
