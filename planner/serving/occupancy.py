"""What a simulated replica held over time: time-weighted integrals of the running requests
and of the KV tokens holding data and reserved, their peaks, the inter-token latencies and
periodic samples. ``planner.serving.metrics`` turns them into vLLM-keyed figures. Pure."""

from __future__ import annotations

import math


class Occupancy:
    """Accumulated step by step by the event loop (``planner.serving.sim``)."""

    __slots__ = ("steps", "busy_s", "running_integral", "kv_held_integral",
                 "kv_reserved_integral", "max_running", "peak_kv_held_tokens",
                 "peak_kv_reserved_tokens", "itl", "samples", "sample_every_s",
                 "next_sample_s")

    def __init__(self, sample_every_s: float | None = None):
        self.steps = 0
        self.busy_s = 0.0
        self.running_integral = 0.0  # of running requests over time
        self.kv_held_integral = 0.0  # of KV tokens holding data
        self.kv_reserved_integral = 0.0  # of KV tokens reserved (blocks or reservations)
        self.max_running = 0
        self.peak_kv_held_tokens = 0
        self.peak_kv_reserved_tokens = 0
        self.itl: list[tuple[float, int]] = []  # (inter-token latency, tokens that waited it)
        self.samples: list[tuple[float, int, int, int]] = []  # (t, running, waiting, KV)
        self.sample_every_s = sample_every_s
        self.next_sample_s = 0.0 if sample_every_s is not None else math.inf

    def record(self, dt: float, running: int, kv_held: int, kv_reserved: int,
               tokens_out: int) -> None:
        """A step of ``dt`` seconds over its state at the start; ``tokens_out`` requests
        got a token from its decodes (static batching's padding gets none)."""
        self.running_integral += running * dt
        self.kv_held_integral += kv_held * dt
        self.kv_reserved_integral += kv_reserved * dt
        if running > self.max_running:
            self.max_running = running
        if kv_held > self.peak_kv_held_tokens:
            self.peak_kv_held_tokens = kv_held
        if kv_reserved > self.peak_kv_reserved_tokens:
            self.peak_kv_reserved_tokens = kv_reserved
        self.busy_s += dt
        self.steps += 1
        if tokens_out > 0:
            self.itl.append((dt, tokens_out))

    def sample(self, t: float, running: int, waiting: int, kv_reserved: int) -> None:
        """A sample at ``t`` (the loop calls this once ``t`` reaches ``next_sample_s``)."""
        self.samples.append((t, running, waiting, kv_reserved))
        self.next_sample_s = t + self.sample_every_s
