"""All-reduce and all-to-all timed across local devices, reported as nccl-tests does.

One process per device (NCCL on GPUs; gloo across processes on a CPU, so the path is tested
without a GPU), each running the collective over message sizes from 4 KiB up; rank 0 keeps
the median time over repetitions, every rank synchronised by a barrier before each one.

- algorithm bandwidth: message bytes / time;
- bus bandwidth: algorithm bandwidth x 2 (n - 1) / n for all-reduce and (n - 1) / n for
  all-to-all (the nccl-tests convention: the rate each link sustains, comparable across n).

The planner's TP model is t = 2 (n - 1) / n x S / bus bandwidth + latency per all-reduce; the
fit below gives it those two numbers: the latency is the time of the smallest message, the bus
bandwidth the best of the largest messages.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

from planner.core.errors import first_line

SIZES_BYTES = tuple(4096 * 4 ** k for k in range(10))  # 4 KiB .. 1 GiB, capped by max_bytes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, backend: str, sizes: tuple[int, ...], port: int,
            budget_s: float, queue) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world)
    dev = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(dev)
    out: dict = {"all_reduce": [], "all_to_all": [], "skipped": {}}
    for op in ("all_reduce", "all_to_all"):
        for size in sizes:
            n = max(world, size // 4 // world * world)  # float32, divisible by the ranks
            x = torch.ones(n, dtype=torch.float32, device=dev)
            y = torch.empty_like(x)

            def run(x=x, y=y, op=op) -> None:
                if op == "all_reduce":
                    dist.all_reduce(x)
                else:
                    dist.all_to_all_single(y, x)
                if backend == "nccl":
                    torch.cuda.synchronize(dev)
            try:
                run()
                run()
            except (RuntimeError, NotImplementedError) as err:
                out["skipped"][op] = f"{type(err).__name__}: {first_line(err)[:160]}"
                break
            # every rank runs the same number of repetitions (a barrier each): the count
            # comes from one timed call, the largest any rank proposes
            t = time.perf_counter()
            run()
            want = torch.tensor([min(200, max(5, int(budget_s / max(time.perf_counter() - t,
                                                                     1e-6))))],
                                dtype=torch.float64, device=dev)
            dist.all_reduce(want, op=dist.ReduceOp.MAX)
            times: list[float] = []
            for _ in range(int(want.item())):
                dist.barrier()
                t = time.perf_counter()
                run()
                times.append(time.perf_counter() - t)
            med = torch.tensor([statistics.median(times)], dtype=torch.float64, device=dev)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
            t_s = float(med.item())
            factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
            out[op].append({"bytes": n * 4, "time_s": t_s, "algbw_bytes_per_s": n * 4 / t_s,
                            "busbw_bytes_per_s": n * 4 / t_s * factor, "reps": len(times)})
    if rank == 0:
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def fit(points: list[dict]) -> dict | None:
    """(latency, bus bandwidth) of t = 2 (n - 1) / n x S / busbw + latency, from the curve."""
    if not points:
        return None
    small = min(points, key=lambda p: p["bytes"])
    large = sorted(points, key=lambda p: p["bytes"])[-3:]
    return {"latency_s": small["time_s"],
            "bus_bandwidth_bytes_per_s": max(p["busbw_bytes_per_s"] for p in large),
            "from": f"latency: the {small['bytes']}-byte message; bus bandwidth: the best of "
                    f"the {len(large)} largest"}


def measure(kind: str, *, world: int | None = None, max_bytes: int | None = None,
            budget_s: float = 0.2, timeout_s: float = 600) -> dict:
    """Time the collectives across ``world`` local ranks; returns the curves and the fit, or
    a record of why nothing could run."""
    import multiprocessing as mp

    import torch

    if kind == "cuda":
        n_dev = torch.cuda.device_count()
        world = world or n_dev
        if world < 2 or n_dev < world:
            return {"skipped": f"{n_dev} CUDA device(s) visible: an all-reduce needs 2 or more"}
        backend = "nccl"
    else:
        world, backend = world or 2, "gloo"
    cap = max_bytes or ((1 << 28) if kind == "cuda" else (1 << 24))
    sizes = tuple(s for s in SIZES_BYTES if s <= cap)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, backend, sizes, port, budget_s, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        res = queue.get(timeout=timeout_s)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    return {"backend": backend, "world_size": world, **res,
            "fit": {"all_reduce": fit(res["all_reduce"]), "all_to_all": fit(res["all_to_all"])}}
