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

# Each partition is a collective of its own (a schedule, its transfers, per-rank credit):
# ByteScheduler's own partitions are 1-8 MB, so 10,000 covers 10 GB at the smallest.
MAX_PARTITIONS = 10_000
# No gradient is larger than this (a 16-billion-parameter model in fp32): beyond it a size is
# a typo, whatever the memory (a 10^30-byte prediction once came out as 1.3e23 s).
MAX_GRADIENT_BYTES = 64 << 30


def check_gradient_bytes(size: int) -> None:
    """ValueError for a gradient beyond MAX_GRADIENT_BYTES; the caller names the field."""
    if size > MAX_GRADIENT_BYTES:
        raise ValueError(f"a gradient of {size:,} bytes is more than the {MAX_GRADIENT_BYTES:,} any run takes")


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
    count = sum(-(-size // limit) for size in tensor_sizes)  # counted before any is made
    if count > MAX_PARTITIONS:
        fewest = -(-total * itemsize // MAX_PARTITIONS)
        raise ValueError(f"partition_bytes: {max_bytes:,} B cuts the {total * itemsize:,}-byte gradient into {count:,} "
                         f"partitions, more than {MAX_PARTITIONS:,}: use partitions of at least {fewest:,} B")
    out, offset = [], 0
    for index, size in enumerate(tensor_sizes):
        for start in range(0, size, limit):
            out.append(Partition(offset + start, min(limit, size - start), index))
        offset += size
    return sorted(out, key=lambda p: (p.priority, p.offset))
