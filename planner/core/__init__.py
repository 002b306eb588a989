"""One deployment's arithmetic: specs, ops, memory, engine profiles, achievable ceilings,
roofline and estimate. Pure; imports nothing of planner outside core/."""
