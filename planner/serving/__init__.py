"""Serving simulation: a request stream on one replica, continuous or static batching, paged or
contiguous KV, each step costed by the estimate's operator and engine model. Pure."""
