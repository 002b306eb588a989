"""Files and pictures: the catalog (YAML / HF config.json -> specs), report PNGs, rich
rendering, number formatting, and watch (a Prometheus scrape). May import every layer below the
CLI."""
