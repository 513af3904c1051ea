#!/usr/bin/env python3
"""One rank of PyTorch's own gloo allreduce, for bench/agent_dataplane.py to run beside the
agents on the same lab: `python gloo_allreduce.py RANK WORLD MASTER_ADDR ELEMENTS ITERATIONS`,
run inside the rank's server with GLOO_SOCKET_IFNAME naming its fabric NIC. A warm-up, then
ITERATIONS allreduces back to back; prints {"rank", "seconds_per_op"} as JSON."""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    rank, world, master, elements, iterations = sys.argv[1:6]
    rank, world, elements, iterations = int(rank), int(world), int(elements), int(iterations)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:29500", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    tensor = torch.ones(elements, dtype=torch.float32)
    dist.all_reduce(tensor)  # warm-up: connections, buffers
    dist.barrier()
    began = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(tensor)
    spent = time.perf_counter() - began
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "seconds_per_op": spent / iterations}))


if __name__ == "__main__":
    main()
