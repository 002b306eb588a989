"""Request streams served step by step on one replica: traffic (``traffic``), the requests and
their states (``requests``), the scheduler's settings (``config``), the KV pool (``kv``), the
decode pool (``decoding``), one scheduler per batching policy (``schedulers``), arrivals
(``arrivals``), step costing with the estimate's operator and engine model (``cost``,
``costers``, ``steps``), speculative decoding (``speculation``), occupancy over time
(``occupancy``), metrics (``metrics``), the event loop that ties them (``sim``) and one
replica of a ``Deployment`` served the way every command simulates (``run``); the cycle
collector paused while streams are built and run (``gcpause``). Pure; imports layouts/ and
core/."""
