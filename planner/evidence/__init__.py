"""Measurements against predictions: the published-row validation, engine-profile fitting,
capacity budgets, served runs replayed through the simulator, benchmark result-file formats,
compare and calibrate, and the error bands built from held-out error. Imports serving/,
layouts/ and core/; files are read by io/."""
