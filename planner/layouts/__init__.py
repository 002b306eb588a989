"""One replica over several GPUs: the Layout and Deployment values, pipeline stages, expert
parallelism and speculative decoding, costed with the core's formulas. Pure; imports core/."""
