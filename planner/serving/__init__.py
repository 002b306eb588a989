"""Request streams served step by step on one replica: traffic, the KV pool, batching
schedulers, step costing (the estimate's operator and engine model), metrics and the event
loop that ties them. Pure; imports layouts/ and core/."""
