"""A command's defaults as a plain dict, so a command's body can be a plain function of its
parameters by name (``estimate_run``, ``plan_run``, ``simulate_run``) that the web page
(planner/ui) calls with only the values a user set, the defaults declared once, in the
command's signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable


def command_defaults(command: Callable) -> dict:
    """Each parameter of ``command`` that has a default, with it."""
    return {name: p.default for name, p in inspect.signature(command).parameters.items()
            if p.default is not inspect.Parameter.empty}
