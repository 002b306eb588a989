"""llmplan: a capacity planner and roofline calculator for LLM inference.

The analytic core (specs, ops, memory, roofline, estimate, budget) is pure: it reads no
files, prints nothing and imports neither torch, yaml, rich, pandas nor matplotlib. The edge
(catalog, cli, report) does the I/O and rendering and calls the core.
"""

__version__ = "0.1.0"
