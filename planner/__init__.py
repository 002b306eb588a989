"""llmplan: a capacity planner and roofline calculator for LLM inference.

The package is in layers; each may import only the layers below it (tests/test_layers.py walks
every module's imports and fails on one that runs upward):

    ui/         the local web page (`llmplan ui`): a server and JSON API over the commands'
                own functions, with its static page; the one layer above cli/
    cli/        one module per command: parse options, one library call, render
    io/         files and pictures: catalog (YAML / HF config.json -> specs), report PNGs,
                rich rendering, number formatting, watch (Prometheus scrape)
    search/     many deployments at once: the vectorized sweep, the SLO plan
    evidence/   measurements against predictions: validate, fit, budgets, served runs,
                result-file formats, compare, calibrate, error bands
    serving/    request streams served step by step: traffic, KV pool, schedulers, step
                costing, metrics, the event loop (pure)
    layouts/    one replica over several GPUs: the deployment value, pipeline and expert
                parallelism, speculative decoding (pure)
    core/       one deployment's arithmetic: specs, ops, memory, engine, achievable ceilings,
                roofline, estimate (pure)

search/ and evidence/ stand side by side: neither imports the other. Pure means no file or
network I/O, no printing, and no torch, pandas, matplotlib, rich or yaml.
"""

__version__ = "0.1.0"
