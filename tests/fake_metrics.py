"""A metrics endpoint with vLLM's (or SGLang's) metric names, served by prometheus-client over
real HTTP, whose values advance by a fixed step at every scrape: the test stand-in for a
running server (metric names from vllm/v1/metrics/loggers.py and
python/sglang/srt/metrics/collector.py)."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.registry import Collector

# vLLM's TTFT and TPOT bucket bounds (vllm/v1/metrics/loggers.py), shortened
TTFT_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)
TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15)

# what one scrape adds: 2 requests of 1,000 prompt and 100 output tokens (a few hundred
# tokens/s at the tests' intervals: a load an 8B model on one GPU can serve)
PER_SCRAPE = {"requests": 2, "prompt_tokens": 2000, "generation_tokens": 200}
TTFT_VALUES = (0.05, 0.2)  # mean 0.125 s
TPOT_VALUE = 0.012
RUNNING, WAITING, KV_USAGE = 16, 2, 0.25


class Advancing(Collector):
    """Collects an inner registry after advancing it by one step: each scrape sees more."""

    def __init__(self, kind: str = "vllm"):
        self.inner = CollectorRegistry()
        self.scrapes = 0
        self.lock = threading.Lock()
        p = "vllm:" if kind == "vllm" else "sglang:"
        labels = ["model_name"]
        if kind == "vllm":
            names = dict(running="num_requests_running", waiting="num_requests_waiting",
                         kv="kv_cache_usage_perc", prompt="prompt_tokens",
                         gen="generation_tokens", done="request_success",
                         ttft="time_to_first_token_seconds",
                         tpot="time_per_output_token_seconds")
        else:
            names = dict(running="num_running_reqs", waiting="num_queue_reqs",
                         kv="token_usage", prompt="prompt_tokens", gen="generation_tokens",
                         done="num_requests", ttft="time_to_first_token_seconds",
                         tpot="inter_token_latency_seconds")
        r = self.inner
        self.running = Gauge(p + names["running"], "Running requests", labels, registry=r)
        self.waiting = Gauge(p + names["waiting"], "Waiting requests", labels, registry=r)
        self.kv = Gauge(p + names["kv"], "KV cache usage, 1 = full", labels, registry=r)
        self.prompt = Counter(p + names["prompt"], "Prefill tokens", labels, registry=r)
        self.gen = Counter(p + names["gen"], "Generated tokens", labels, registry=r)
        self.done = Counter(p + names["done"], "Finished requests", labels, registry=r)
        self.ttft = Histogram(p + names["ttft"], "Time to first token", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(p + names["tpot"], "Time per output token", labels,
                              buckets=TPOT_BUCKETS, registry=r)
        # a second model's series, which --model-name must leave out
        self.gen.labels(model_name="other").inc(10**6)

    def step(self) -> None:
        m = "meta-llama/Llama-3.1-8B-Instruct"
        self.running.labels(model_name=m).set(RUNNING)
        self.waiting.labels(model_name=m).set(WAITING)
        self.kv.labels(model_name=m).set(KV_USAGE)
        self.prompt.labels(model_name=m).inc(PER_SCRAPE["prompt_tokens"])
        self.gen.labels(model_name=m).inc(PER_SCRAPE["generation_tokens"])
        self.done.labels(model_name=m).inc(PER_SCRAPE["requests"])
        for v in TTFT_VALUES:
            self.ttft.labels(model_name=m).observe(v)
        for _ in range(PER_SCRAPE["generation_tokens"] - PER_SCRAPE["requests"]):
            self.tpot.labels(model_name=m).observe(TPOT_VALUE)

    def collect(self):
        with self.lock:
            self.step()
            self.scrapes += 1
            yield from self.inner.collect()


def serve(kind: str = "vllm"):
    """(url, collector, server): a live endpoint on a free port of 127.0.0.1."""
    reg = CollectorRegistry()
    col = Advancing(kind)
    reg.register(col)
    got = start_http_server(0, addr="127.0.0.1", registry=reg)
    server = got[0]
    return f"http://127.0.0.1:{server.server_port}/metrics", col, server
