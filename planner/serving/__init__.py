"""Request streams served step by step on one replica: traffic (``traffic``), the requests and
their states (``requests``), the scheduler's settings (``config``), the KV pool (``kv``), the
decode pool (``decoding``), one scheduler per batching policy (``schedulers``), arrivals
(``arrivals``), step costing with the estimate's operator and engine model (``cost``,
``layouts``, ``steps``), speculative decoding (``speculation``), occupancy over time
(``occupancy``), metrics (``metrics``) and the event loop that ties them (``sim``). Pure;
imports layouts/ and core/."""
