"""Structural drawings of a topology: the figure a researcher puts on a slide.

Each kind is laid out by its own structure (topology/layouts.py, the layout its kind
registered); `draw()` renders that into a PNG with matplotlib's Agg canvas, shrinking the
layout's preferred scale within figure-size bounds and picking label fonts and rotations so
that no two node labels overlap.
"""

from __future__ import annotations

import math
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

from orchestrator.topology.kinds import kind_of
from orchestrator.topology.layouts import Edge, Layout, Point, layout, positions  # noqa: F401 (re-exported)
from orchestrator.topology.model import Topology

DPI = 120
MAX_WIDTH, MAX_HEIGHT = 40.0, 30.0  # figure bounds, inches
PAD = 0.9  # most inches the axes need around the outermost node centres (boxes, captions)
MARGIN, TOP, BOTTOM = 0.2, 0.7, 0.6  # inches of figure around the axes: title, legend
MAX_LABELLED = 600  # beyond this, labels cannot be legible anyway: draw plain markers
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


# -- rendering --------------------------------------------------------------------------------
def default_title(topology: Topology) -> str:
    """E.g. "BCube n=4 k=1: 16 servers, 8 switches, 32 links"."""
    params = " ".join(f"{key}={value}" for key, value in topology.params.items()
                      if key != "servers")  # a star's only parameter: the count says it
    counts = [(len(topology.servers), "server"), (len(topology.switches), "switch"),
              (len(topology.links), "link")]
    parts = [f"{n} {word}{'es' if word == 'switch' else 's'}" if n != 1 else f"1 {word}"
             for n, word in counts if n or word != "switch"]
    name = f"{kind_of(topology.kind).title} {params}".strip()
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
