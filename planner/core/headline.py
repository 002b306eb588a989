"""The headline figures of a replica serving a batch: TTFT, TPOT, latency, throughput and cost,
defined once for every layout (a TP group, pipeline stages, expert-parallel GPUs).

    latency = TTFT + TPOT x (output_tokens - 1)
    decode throughput = batch / TPOT                        tokens/s
    end-to-end throughput = batch x output_tokens / latency tokens/s
    cost per 1M output tokens = price per GPU-hour x GPUs / 3600 / end-to-end throughput x 1e6

Numbers, or broadcastable arrays (a sweep evaluates a grid with the same formulas). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Headline:
    ttft_s: object
    tpot_s: object
    batch: object
    output_tokens: object
    num_gpus: int
    price_usd_per_gpu_hour: float | None = None

    @property
    def latency_s(self):
        return self.ttft_s + self.tpot_s * (self.output_tokens - 1)

    @property
    def throughput_tokens_per_s(self):
        return self.batch / self.tpot_s

    @property
    def e2e_throughput_tokens_per_s(self):
        return self.batch * self.output_tokens / self.latency_s

    @property
    def cost_usd_per_million_output_tokens(self):
        """Every GPU of the replica, for the batch's output over its whole latency; None
        without a price."""
        if self.price_usd_per_gpu_hour is None:
            return None
        usd_per_s = self.price_usd_per_gpu_hour * self.num_gpus / 3600
        return usd_per_s / self.e2e_throughput_tokens_per_s * 1e6

    def as_dict(self) -> dict:
        return {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "latency_s": self.latency_s,
                "throughput_tokens_per_s": self.throughput_tokens_per_s,
                "e2e_throughput_tokens_per_s": self.e2e_throughput_tokens_per_s,
                "cost_usd_per_million_output_tokens": self.cost_usd_per_million_output_tokens}
