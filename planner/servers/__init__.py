"""Measurements of real servers: benchmark result files (`compare`, `calibrate`) and live
Prometheus metrics (`watch`), set against the hardware's limits and llmplan's prediction."""
