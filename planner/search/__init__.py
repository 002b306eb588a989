"""Many deployments at once: the vectorized sweep (numpy/pandas) and the SLO plan sized by the
simulator. Imports serving/, layouts/ and core/; never evidence/ (its sibling) or above."""
