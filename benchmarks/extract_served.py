"""Write the part of a published serving-benchmark result file that `llmplan compare` and
`llmplan validate` read: the JSON as published, less the per-request lists they do not read
(``ttfts``, ``itls``, ``generated_texts``, ``errors``), which are most of its megabytes. Every
other key keeps its published value; the published file's SHA-256 is printed for the manifest
(planner/data/served/*.yaml, ``sha256`` and ``kept: extract``).

    python benchmarks/extract_served.py PUBLISHED.json OUT.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

DROPPED = ("ttfts", "itls", "generated_texts", "errors")


def extract(data: dict) -> dict:
    return {k: v for k, v in data.items() if k not in DROPPED}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    src, out = Path(argv[0]), Path(argv[1])
    raw = src.read_bytes()
    data = json.loads(raw)
    if not isinstance(data, dict):
        print(f"{src}: not one JSON object (keep JSON Lines verbatim)", file=sys.stderr)
        return 2
    out.write_text(json.dumps(extract(data), indent=1) + "\n")
    print(f"sha256 {hashlib.sha256(raw).hexdigest()}  {src} -> {out} "
          f"({len(raw):,} -> {out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
