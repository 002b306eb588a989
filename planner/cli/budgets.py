"""`llmplan-check FILE...`: `llmplan check` over several budget files, the way a CI step or a
pre-commit hook runs it (the composite Action in action.yml, .pre-commit-hooks.yaml).

Each file is checked as `llmplan check FILE` checks it, with the same options (--engine,
--calibration, --prices, --price, --expert-imbalance, --at) and, with ``--junit-dir DIR``, its JUnit
XML written to DIR/<file stem>.xml. Under GitHub Actions `check` annotates the failing
limits on the pull request itself. The exit code is the worst of the files': 2 when a file
is bad, else 1 when a limit fails, else 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


class _OneLine(argparse.ArgumentParser):
    """Bad usage is one line on stderr and exit 2, as every llmplan command's is (argparse
    prints its whole usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _OneLine(
        prog="llmplan-check", description="llmplan check over several budget files: exit 0 "
        "when every limit holds, 1 when one fails, 2 for a bad file.")
    p.add_argument("budgets", nargs="+", type=Path, metavar="FILE",
                   help="budget YAML files")
    p.add_argument("--engine", "-e", metavar="ENGINE",
                   help="engine profile for deployments that name none")
    p.add_argument("--calibration", metavar="FILE",
                   help="measured ceilings (llmplan measure --calibrate)")
    p.add_argument("--prices", metavar="SET|FILE",
                   help="the price set costs are on (llmplan prices)")
    p.add_argument("--price", action="append", default=[], metavar="GPU=USD",
                   help="USD per GPU-hour for one GPU (repeatable)")
    p.add_argument("--expert-imbalance", metavar="RATIO", help="max / mean expert load")
    p.add_argument("--at", metavar="predicted|high",
                   help="hold the limits at the prediction or at its error band's slow end")
    p.add_argument("--junit-dir", type=Path, metavar="DIR",
                   help="write DIR/<budget stem>.xml per file")
    return p


def main(argv: list[str] | None = None) -> int:
    """Every error one line and exit 2, as llmplan's own (a folder that cannot be made, an
    option every file would refuse alike)."""
    try:
        return _main(argv)
    except OSError as err:  # --junit-dir: a name too long, a file in the way, no permission
        from planner.cli.app import printable

        name = f"{str(err.filename)[:120]}: " if err.filename is not None else ""
        print(printable(f"llmplan-check: error: {name}{err.strerror or err}"), file=sys.stderr)
        return 2


def _main(argv: list[str] | None) -> int:
    import contextlib
    import io

    from planner.cli.app import main as llmplan
    from planner.cli.app import printable

    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    common: list[str] = []
    for flag in ("engine", "calibration", "prices", "expert_imbalance", "at"):
        v = getattr(a, flag)
        if v is not None:
            common += [f"--{flag.replace('_', '-')}", v]
    for p in a.price:
        common += ["--price", p]
    if a.junit_dir is not None:
        a.junit_dir.mkdir(parents=True, exist_ok=True)
    codes = []
    for budget in a.budgets:
        junit = [] if a.junit_dir is None else ["--junit", str(a.junit_dir / f"{budget.stem}.xml")]
        print(printable(f"== {budget}"), flush=True)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = llmplan(["check", str(budget), *common, *junit]) or 0
        said = err.getvalue()
        sys.stderr.write(said)
        codes.append(code)
        if code == 2 and str(budget) not in said and budget.name not in said:
            break  # the options are wrong, not this file: every other file would say so too
    return 2 if 2 in codes else 1 if 1 in codes else 0


if __name__ == "__main__":
    sys.exit(main())
