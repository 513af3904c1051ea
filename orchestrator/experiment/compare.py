"""Two results directories side by side (`testbed compare A B`), from their results.json alone.

Points are matched by what they measured — topology, link rate, gradient size, ByteScheduler
partitioning, algorithm —
not by position, so two runs of the same file match point for point and two different
experiments match where they overlap; a point of one run only is listed with blanks.

Both results.json are read through results.load (untrusted input, one line per problem);
`--out` is written by `write`, never through a symlink.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.emulation.journal import write_inside
from orchestrator.errors import BadUsage

HEADER = ["point", "algorithm", "GST A s", "GST B s", "B/A", "ratio A", "ratio B", "verdict A", "verdict B"]


def key(point: dict) -> tuple:
    partitioning = point.get("partitioning") or {}
    return (point["topology"], point["link_rate"], point["size_bytes"], partitioning.get("partition_bytes"),
            partitioning.get("credit_bytes"), point["algorithm"],
            *(str(point.get(field)) for field in ("job", "mode", "placement")),  # jobs: alone and together apart
            *(str(point.get(field)) for field in ("queue", "tcp_congestion")))  # swept queues and congestion


@dataclass(frozen=True)
class Row:
    id: str
    algorithm: str
    a: dict | None
    b: dict | None

    @staticmethod
    def _gst(point: dict | None) -> float | None:
        return ((point or {}).get("gst_s") or {}).get("mean")

    @property
    def change(self) -> float | None:
        """GST of B over GST of A: below 1, B was faster."""
        a, b = self._gst(self.a), self._gst(self.b)
        return b / a if a and b else None

    def cells(self) -> list[str]:
        return [self.id, self.algorithm, _number(self._gst(self.a)), _number(self._gst(self.b)),
                _number(self.change, ".3f"), _number((self.a or {}).get("ratio"), ".3f"),
                _number((self.b or {}).get("ratio"), ".3f"), _verdict(self.a), _verdict(self.b)]


def _number(value: float | None, spec: str = ".4g") -> str:
    return "–" if value is None else format(value, spec)


def _verdict(point: dict | None) -> str:
    if point is None:
        return "absent"
    if point.get("status") != "done":
        return point.get("status", "–")
    return (point.get("fidelity") or {}).get("verdict", "–")


def rows(a: dict, b: dict) -> list[Row]:
    """A's points in A's order with their match in B, then B's points that A lacks."""
    in_b = {key(p): p for p in b["points"]}
    matched = [Row(p["id"], p["algorithm"], p, in_b.get(key(p))) for p in a["points"]]
    in_a = {key(p) for p in a["points"]}
    return matched + [Row(p["id"], p["algorithm"], None, p) for p in b["points"] if key(p) not in in_a]


def _title(results: dict, directory: Path) -> str:
    return f"{results['experiment']['name']} ({results['status']}, {results['started']}) in {directory}"


def markdown(a: dict, b: dict, dir_a: Path, dir_b: Path) -> str:
    lines = [f"# {a['experiment']['name']} vs {b['experiment']['name']}", "",
             f"- A: {_title(a, dir_a)}", f"- B: {_title(b, dir_b)}", "",
             "GST: the slowest agent's mean over the measured iterations; B/A below 1: B was faster; "
             "ratio: measured / predicted in each run.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows(a, b)]
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> Path:
    """`text` into `path` (`--out`) whole, refusing a symlink there or a symlinked directory
    holding it; every problem one BadUsage line naming `--out`."""
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise BadUsage(f"--out {path}: not a file name: give the path of a Markdown file")
    try:
        return write_inside(path.parent, path.name, text)
    except BadUsage as exc:
        raise BadUsage(f"--out: {exc}") from None
