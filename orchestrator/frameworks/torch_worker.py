"""One rank of PyTorch's own collectives on a lab server (`python -m
orchestrator.frameworks.torch_worker`, its job as JSON on stdin; torch_gloo.py starts one per
server, in the server's network, with GLOO_SOCKET_IFNAME naming its fabric NICs).

Its job is the first line on stdin; the end of stdin stops it. Two modes, as the experiment's
workload asks:
- `all_reduce`: per iteration, the emulated compute (slept), then one `all_reduce` of the
  whole gradient as one flat float32 buffer (what DDP does with one bucket; NCCL-tests'
  loop when there is no compute). Every rank contributes rank + 1 in every element, and the
  sum is checked exactly after each operation.
- `ddp`: the digits MLP (64 → hidden → 10) trained with DistributedDataParallel and SGD on
  this rank's shard; the parameters' digest after each step is reported, and every rank
  must hold the same.

Prints one JSON line per iteration: {iteration, start_time (Unix, entering the collective),
gst_s (in it), compute_s (since leaving the previous one: compute, the check, the refill),
verified, loss, param_digest}. The rendezvous (a TCPStore on rank 0) goes over the fabric,
before anything is timed: the management network carries only the host's conversations with
each server (emulation/isolation.py), so servers cannot reach each other there.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta

RENDEZVOUS_S = 60.0  # every rank has imported torch and reached rank 0's store by then


def _emit(row: dict) -> None:
    sys.stdout.write(json.dumps(row) + "\n")
    sys.stdout.flush()


def _all_reduce(job: dict, dist, torch) -> None:
    rank, world = job["rank"], job["world"]
    buffer = torch.empty(job["elements"], dtype=torch.float32)
    expected = float(world * (world + 1) // 2)  # exact in float32 up to 2^24
    compute = job.get("compute") or [0.0] * job["iterations"]
    left = time.perf_counter()
    verified = True
    for iteration in range(job["iterations"]):
        buffer.fill_(float(rank + 1))
        if compute[iteration] > 0:
            time.sleep(compute[iteration])
        entered = time.perf_counter()
        start_time = time.time()
        dist.all_reduce(buffer)
        done = time.perf_counter()
        verified = bool(torch.all(buffer == expected))
        _emit({"iteration": iteration, "start_time": start_time, "gst_s": done - entered,
               "compute_s": entered - left, "verified": verified, "loss": 0.0, "param_digest": ""})
        left = done


def _ddp(job: dict, dist, torch) -> None:
    import numpy as np
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    digits = job["digits"]
    torch.manual_seed(digits["seed"])  # the same start on every rank (DDP broadcasts rank 0's too)
    model = nn.Sequential(nn.Linear(64, digits["hidden"]), nn.Tanh(), nn.Linear(digits["hidden"], 10))
    ddp = DistributedDataParallel(model)
    optimiser = torch.optim.SGD(ddp.parameters(), lr=digits["lr"])
    x = torch.tensor(np.asarray(digits["data"]["x"], dtype=np.float32) / 16.0)  # float32: 4 bytes a parameter, as priced
    y = torch.tensor(np.asarray(digits["data"]["y"], dtype=np.int64))
    batch = digits["batch"]
    left = time.perf_counter()
    for iteration in range(job["iterations"]):
        index = torch.arange(iteration * batch, iteration * batch + batch) % max(1, len(x))
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x[index]), y[index])
        entered = time.perf_counter()
        start_time = time.time()
        loss.backward()  # DDP's hooks allreduce the gradient's buckets as backward produces them
        optimiser.step()
        done = time.perf_counter()
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
        _emit({"iteration": iteration, "start_time": start_time, "gst_s": done - entered,
               "compute_s": entered - left, "verified": True, "loss": float(loss), "param_digest": digest})
        left = time.perf_counter()


def _stop_when_stdin_ends() -> None:
    """The launcher closes our stdin to stop us (or dies, which closes it): then we end, in a
    container too, where the launcher's kill cannot reach."""
    sys.stdin.read()
    os._exit(3)


def main() -> None:
    job = json.loads(sys.stdin.readline())
    threading.Thread(target=_stop_when_stdin_ends, daemon=True).start()
    signal.alarm(int(job["timeout"]) + 30)  # and a worker whose stdin never ends, after the run's timeout
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core's worth per server, as an agent
    # the rendezvous: a store on rank 0, which every rank must reach within RENDEZVOUS_S
    store = dist.TCPStore(job["master"], job["port"], job["world"], is_master=job["rank"] == 0,
                          timeout=timedelta(seconds=min(RENDEZVOUS_S, job["timeout"])))
    dist.init_process_group("gloo", store=store, rank=job["rank"], world_size=job["world"],
                            timeout=timedelta(seconds=job["timeout"]))
    try:
        (_ddp if job["mode"] == "ddp" else _all_reduce)(job, dist, torch)
        dist.barrier()  # no rank leaves (closing its pairs) while another still reads from them
    finally:
        dist.destroy_process_group()
    # Every row is out: leave without the interpreter's teardown, where torch's C++ threads
    # (the store's, DDP's reducer) can still be joinable and abort the process ("terminate
    # called without an active exception", seen once in 15 iterations of DDP here), turning a
    # finished run into a failed one
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
