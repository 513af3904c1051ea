"""PyTorch's collectives on the lab (`framework: torch`): one torch_worker process per server,
started in the server's network, bound to its fabric NICs (GLOO_SOCKET_IFNAME). gloo's CPU allreduce is a ring (reduce-scatter, then
allgather), so its points are priced with the project's ring.

A back-to-back, model or tensors workload is an all_reduce of the gradient per iteration (after
the compute each worker was handed); digits is a DistributedDataParallel training loop of the
digits MLP on each worker's shard, the same shards the agents train on."""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import secrets
import signal
import subprocess
import threading
import time

from orchestrator.errors import RunError
from orchestrator.frameworks.table import FrameworkResult, Job, register_framework

PORTS = (29400, 29900)  # the rendezvous's TCP port, on rank 0's fabric address
KILL_GRACE_S = 5.0
WORKER = "orchestrator.frameworks.torch_worker"
IMAGE = "testbed/server-torch:latest"  # testbed/server with torch: built on demand (emulation/images.py)


def missing() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed in this environment: ./setup.sh installs it (pip install torch==2.13.0, CPU build)"
    return None


def _jobs(job: Job) -> list[dict]:
    world = len(job.nodes)
    master = str(job.lab.topology.address_of(job.nodes[0]))  # its fabric address: see torch_worker
    port = PORTS[0] + secrets.randbelow(PORTS[1] - PORTS[0])  # a new port per run: no TIME_WAIT of the last
    common = {"world": world, "master": master, "port": port, "iterations": job.iterations, "timeout": job.timeout,
              "elements": sum(job.tensors)}
    out = []
    for rank in range(world):
        mine = {**common, "rank": rank, "mode": "all_reduce",
                "compute": [row[rank] for row in job.compute] if job.compute is not None
                else [float(getattr(getattr(job.workload, "compute", None), "seconds", 0.0))] * job.iterations}
        if job.workload.kind == "digits":
            from orchestrator.control.workloads import digits  # the agents' shards, for the same data

            w = job.workload
            mine.update(mode="ddp", digits={**digits(world, rank, w.hidden, w.lr, w.batch, w.seed), "seed": w.seed})
        out.append(mine)
    return out


def _nics(lab, node: str) -> str:
    return ",".join(nic.name for nic in lab.topology.nodes[node].data_nics())


def run(job: Job) -> FrameworkResult:
    """Run the point; RunError naming the rank and node when one fails or overstays."""
    if not hasattr(job.lab, "start_module"):
        raise RunError(f"framework torch: lab {getattr(job.lab, 'name', '?')} cannot start processes on its servers "
                       "from here (a lab split over hosts): run these points on one host")
    procs = []
    try:
        for rank, (node, spec) in enumerate(zip(job.nodes, _jobs(job))):
            env = {"GLOO_SOCKET_IFNAME": _nics(job.lab, node), "OMP_NUM_THREADS": "1"}
            proc = job.lab.start_module(node, WORKER, env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
            proc.stdin.write(json.dumps(spec) + "\n")  # stdin stays open: its end tells the worker to stop
            proc.stdin.flush()
            procs.append(proc)
        rows = _collect(job, procs)
    finally:
        _stop(procs)
    records = [{"rank": rank, "node": node, "bytes_sent": 0, "bytes_received": 0, **row}
               for rank, node in enumerate(job.nodes) for row in rows[rank]]
    return FrameworkResult(records, _check(job, rows))


def _collect(job: Job, procs: list[subprocess.Popen]) -> list[list[dict]]:
    """Every rank's per-iteration rows, read as they come (rank 0's drive `on_iteration`).
    RunError as soon as one rank ends without all of them (the others then wait for it in
    vain), or when the run overstays its timeout."""
    rows: list[list[dict]] = [[] for _ in procs]
    errors: list[str] = [""] * len(procs)
    ended: queue.Queue[int] = queue.Queue()

    def read(rank: int) -> None:
        for line in procs[rank].stdout:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            rows[rank].append(row)
            if rank == 0:
                job.on_iteration(row["iteration"] + 1)
        procs[rank].wait()
        ended.put(rank)

    def drain(rank: int) -> None:  # read as it comes: a full stderr pipe would stop the worker
        for line in procs[rank].stderr:
            errors[rank] = (errors[rank] + line)[-4000:]

    drains = [threading.Thread(target=drain, args=(rank,), daemon=True) for rank in range(len(procs))]
    for rank, drainer in enumerate(drains):
        drainer.start()
        threading.Thread(target=read, args=(rank,), daemon=True).start()
    deadline = time.monotonic() + job.timeout + 60  # the workers' own init and timeouts come first
    for _ in procs:
        try:
            rank = ended.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise RunError(f"torch: no end within {job.timeout + 60:.0f} s") from None
        proc = procs[rank]
        if proc.returncode != 0 or len(rows[rank]) != job.iterations:
            drains[rank].join(timeout=5)
            tail = (errors[rank] or "").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
            raise RunError(f"torch rank {rank} on {job.nodes[rank]}: {tail[0][:300]} "
                           f"({len(rows[rank])} of {job.iterations} iterations)")
    return rows


def _stop(procs: list[subprocess.Popen]) -> None:
    """Nothing outlives the run: each worker's stdin is closed (it stops on that, in a
    container too: `docker exec -i` passes the end on), and any still alive after a grace
    is killed with its session."""
    for proc in procs:
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
    deadline = time.monotonic() + KILL_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _check(job: Job, rows: list[list[dict]]) -> dict:
    """all_reduce: every operation's sum exact on every rank; ddp: every rank's parameters
    identical after every step."""
    iterations = job.iterations
    if job.workload.kind == "digits":
        split = [i for i in range(iterations) if len({rows[r][i]["param_digest"] for r in range(len(rows))}) != 1]
        for rank_rows in rows:
            for row in rank_rows:
                row["verified"] = row["iteration"] not in split
        summary = (f"every rank held identical parameters after each of {iterations} DDP steps" if not split
                   else f"ranks' parameters differ after step(s) {split[:5]}")
        return {"clean": not split, "summary": summary, "iterations": iterations, "lost": 0, "duplicated": 0}
    wrong = sorted({row["iteration"] for rank_rows in rows for row in rank_rows if not row["verified"]})
    summary = (f"every all_reduce summed exactly on every rank ({iterations} iterations)" if not wrong
               else f"all_reduce sums wrong in iteration(s) {wrong[:5]}")
    return {"clean": not wrong, "summary": summary, "iterations": iterations, "lost": 0, "duplicated": 0}


register_framework("torch", run, runs=("ring",), missing=missing, runtimes=("netns", "docker"), image=IMAGE,
                   origin="built-in")
