"""What a worker computes each iteration: an emulated gradient, or a real model's.

Workload JSON (built by orchestrator.control.workloads):

    {"kind": "emulated", "tensors": [elements, …], "compute_seconds": 0.05}
    {"kind": "emulated", "tensors": [...], "compute_seconds": [0.05, 0.07, …]}  # per iteration
    {"kind": "back-to-back", "tensors": [elements, …]}     # NCCL-tests' timed loop
    {"kind": "real", "tensors": [...], "model": "digits-mlp", "hidden": 32, "lr": 0.5,
     "batch": 64, "seed": 0, "data": {"x": [[...]], "y": [...]}}   # this worker's shard

Back-to-back runs allreduces with nothing in between, as NCCL-tests' timed loop does: the
first iteration (the warm-up) reduces an emulated gradient and is checked exactly; the
buffer is then zeroed once and every later iteration reduces it again in place, unrefilled
(a sum of sums would grow N-fold per iteration), each checked to still be zero.

Emulated gradients are small integers, so any summation order gives the exact same sum
and every reduced buffer can be checked. The real model is a numpy MLP on scikit-learn's
bundled digits (no download). Its gradients are sent as fixed-point integers (scaled so
that the sum of all workers stays below 2^24, where float32 is exact), so every algorithm
and every worker ends with bit-identical parameters — reproducibility the field expects.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

import numpy as np

CHECK_POSITIONS = 1024


PERIOD = 17
ROW = PERIOD * 3855  # ~256 KiB of float32: stays in cache while it is broadcast


def _pattern(positions: np.ndarray, rank: int, iteration: int) -> np.ndarray:
    """The emulated gradient's value at `positions` (int64): small, exactly summable."""
    return (positions * 7 + rank * 13 + iteration * 5) % PERIOD - 8


def emulated_gradient(rank: int, iteration: int, size: int, out: np.ndarray) -> None:
    """Small integers that depend on rank, iteration and position (exactly summable).

    The pattern repeats every PERIOD positions, so one row of it is built and broadcast
    over the buffer seen as rows: one numpy call, at memset speed, that holds the GIL only
    at its ends (the agent runs it off its event loop), and no temporary as large as the
    buffer (agent memory stays ~ the buffer itself).
    """
    row = _pattern(np.arange(min(ROW, size), dtype=np.int64), rank, iteration).astype(out.dtype)
    rows = size // len(row) if len(row) else 0
    out[: rows * len(row)].reshape(rows, len(row))[:] = row
    out[rows * len(row) : size] = row[: size - rows * len(row)]


def _sampled(size: int, rng: np.random.Generator) -> np.ndarray:
    return np.unique(np.concatenate([[0, size - 1], rng.integers(0, size, min(CHECK_POSITIONS, size))]))


def check_sum(buffer: np.ndarray, workers: int, iteration: int, rng: np.random.Generator,
              members: list[int] | None = None) -> bool:
    """Compare sampled positions of the reduced buffer with the exact sum over workers
    (the gradients of identities `members`, default 0..workers-1)."""
    positions = _sampled(len(buffer), rng)
    expected = np.zeros(len(positions), dtype=np.int64)
    for rank in range(workers) if members is None else members:
        expected += _pattern(positions, rank, iteration)
    return bool(np.array_equal(buffer[positions].astype(np.int64), expected))


CHECKSUM_POSITIONS = 4096
CHECKSUM_SEED = 17


def _checksum_layout(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions spread over the whole buffer (every partition has some) and their weights,
    the same on every agent for a size."""
    positions = np.unique(np.linspace(0, size - 1, min(size, CHECKSUM_POSITIONS)).astype(np.int64))
    weights = np.random.default_rng(CHECKSUM_SEED).integers(1, 2**20, len(positions), dtype=np.int64)
    return positions, weights


def checksum(buffer: np.ndarray) -> int:
    """A checksum linear in the buffer's integer values: the checksum of a sum is the sum of
    the checksums, exactly (values below 2^24 in magnitude, weights below 2^20, 4096
    positions: under 2^56, no overflow), so an aggregate's says how many times each
    contribution went in (control/checker.py). Microseconds, whatever the buffer's size."""
    if not len(buffer):
        return 0
    positions, weights = _checksum_layout(len(buffer))
    return int(np.dot(np.rint(buffer[positions]).astype(np.int64), weights))


def emulated_checksum(identity: int, iteration: int, size: int) -> int:
    """The checksum of worker `identity`'s emulated gradient at `iteration`, without filling a
    buffer: what the checker uses for a worker that died before reporting it."""
    if not size:
        return 0
    positions, weights = _checksum_layout(size)
    return int(np.dot(_pattern(positions, identity, iteration), weights))


def check_zero(buffer: np.ndarray, rng: np.random.Generator) -> bool:
    """Sampled positions of a back-to-back iteration's result: a sum of zeros stays zero."""
    return not buffer[_sampled(len(buffer), rng)].any()


class DigitsMLP:
    """A one-hidden-layer MLP (64 → hidden → 10) trained with plain SGD on a data shard."""

    def __init__(self, spec: dict, workers: int) -> None:
        self.hidden = spec.get("hidden", 32)
        self.lr = spec.get("lr", 0.5)
        self.batch = spec.get("batch", 64)
        self.workers = workers
        rng = np.random.default_rng(spec.get("seed", 0))  # same seed: same start on every worker
        self.params = [
            rng.normal(0, 0.1, (64, self.hidden)),
            np.zeros(self.hidden),
            rng.normal(0, 0.1, (self.hidden, 10)),
            np.zeros(10),
        ]
        self.x = np.asarray(spec["data"]["x"], dtype=np.float64) / 16.0
        self.y = np.asarray(spec["data"]["y"], dtype=np.int64)
        self.scale = spec.get("scale") or (2.0**23 / (workers * spec.get("clip", 8.0)))
        self.clip = spec.get("clip", 8.0)

    def state(self) -> bytes:
        """The parameters, for a worker that joins a run under way (float64, in order)."""
        return np.concatenate([p.ravel() for p in self.params]).tobytes()

    def restore(self, state: bytes) -> None:
        flat = np.frombuffer(state, dtype=np.float64)
        if len(flat) != sum(p.size for p in self.params):
            raise ValueError(f"model state of {len(flat)} parameters, this model has {sum(p.size for p in self.params)}")
        offset = 0
        for param in self.params:
            param[...] = flat[offset : offset + param.size].reshape(param.shape)
            offset += param.size

    @staticmethod
    def tensor_sizes(hidden: int) -> list[int]:
        return [64 * hidden, hidden, hidden * 10, 10]

    def gradient(self, iteration: int, out: np.ndarray) -> float:
        """Fixed-point gradient of this worker's minibatch into `out`; returns the batch loss."""
        start = (iteration * self.batch) % max(1, len(self.x))
        index = np.arange(start, start + self.batch) % len(self.x)
        x, y = self.x[index], self.y[index]
        w1, b1, w2, b2 = self.params
        hidden = np.tanh(x @ w1 + b1)
        logits = hidden @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(-np.log(probs[np.arange(len(y)), y] + 1e-12).mean())
        delta = probs
        delta[np.arange(len(y)), y] -= 1
        delta /= len(y)
        g_w2, g_b2 = hidden.T @ delta, delta.sum(axis=0)
        back = (delta @ w2.T) * (1 - hidden**2)
        g_w1, g_b1 = x.T @ back, back.sum(axis=0)
        flat = np.concatenate([g.ravel() for g in (g_w1, g_b1, g_w2, g_b2)])
        out[:] = np.round(np.clip(flat, -self.clip, self.clip) * self.scale)
        return loss

    def apply(self, reduced: np.ndarray) -> str:
        """Average the reduced fixed-point gradient, step, and digest the parameters."""
        mean = reduced.astype(np.float64) / (self.scale * self.workers)
        offset = 0
        for param in self.params:
            size = param.size
            param -= self.lr * mean[offset : offset + size].reshape(param.shape)
            offset += size
        digest = hashlib.sha256()
        for param in self.params:
            digest.update(np.ascontiguousarray(param).tobytes())
        return digest.hexdigest()[:16]


def compute_seconds(spec: dict, iteration: int) -> float:
    """The compute before `iteration` (from 0): one figure, or one per iteration (stragglers:
    drawn by the orchestrator for this worker, spec/compute.py)."""
    seconds = spec.get("compute_seconds", 0.0)
    if isinstance(seconds, list):
        return float(seconds[iteration % len(seconds)]) if seconds else 0.0
    return float(seconds)


async def compute(spec: dict, started: float, iteration: int = 0) -> None:
    """Emulated compute: wait out whatever of the iteration's compute the rank's work since
    its last synchronisation (checking its result, filling the next gradient) did not use."""
    seconds = compute_seconds(spec, iteration)
    left = seconds - (time.perf_counter() - started)
    if left > 0:
        await asyncio.sleep(left)
