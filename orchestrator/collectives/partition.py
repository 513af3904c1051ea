"""ByteScheduler-style partitioning and priority (Peng et al., SOSP 2019).

The gradient is a list of tensors in input-to-output order. Each tensor is cut into
partitions of at most `max_bytes`; every partition is its own collective (its own schedule
over its own range of the flat buffer). Partitions start by priority — lower layer index
first, since the next forward pass needs the input side first — with at most `credit_bytes`
in flight. Without partitioning, the whole gradient is one partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Partition:
    offset: int  # elements into the flat buffer
    length: int  # elements
    priority: int  # index of the tensor (layer) it belongs to: lower goes first


def partitions(tensor_sizes: Sequence[int], max_bytes: int | None, itemsize: int = 4) -> list[Partition]:
    """Partitions of a flat buffer laid out as `tensor_sizes` (elements), by priority.

    With `max_bytes` None the whole buffer is one partition (priority 0).
    """
    total = sum(tensor_sizes)
    if max_bytes is None:
        return [Partition(0, total, 0)] if total else []
    limit = max(1, max_bytes // itemsize)
    out, offset = [], 0
    for index, size in enumerate(tensor_sizes):
        for start in range(0, size, limit):
            out.append(Partition(offset + start, min(limit, size - start), index))
        offset += size
    return sorted(out, key=lambda p: (p.priority, p.offset))
