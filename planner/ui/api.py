"""The page's JSON API: a form's fields become the command line of the llmplan command they
stand for, parsed by that command's own typer parser and run by the same plain function the
command calls (``estimate_run``, ...), so what the page shows is what ``llmplan ... --json``
prints, and a bad value gets the CLI's own one-line error.

A request is ``{"fields": {name: text}, "config": {"name": "config.json", "text": ...}}``
(``config``: an uploaded HF config.json, which stands for ``--model``). The answer is
``{"json": ..., "command": "llmplan ...", "extra": {...}}`` (``extra``: what the drawing needs
beside the JSON, from library functions too) or ``{"error": "llmplan: error: ...", "field":
name or null}``, ``field`` naming the form field the error is about.
"""

from __future__ import annotations

import functools
import json
import math
import re
import shlex
import tempfile
from collections.abc import Callable
from pathlib import Path

from planner.core.errors import LlmplanError, flagged
from planner.io.boundary import SPEC_BYTES, MiB

# A request carries at most one config.json (the CLI reads up to SPEC_BYTES of one), escaped
# as a JSON string (at most about twice as long) beside a few short fields.
MAX_BODY_BYTES = 2 * SPEC_BYTES + 64 * 1024
UPLOAD_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}\.json")


class ApiError(Exception):
    """A request the API refuses, with the form field it is about and an HTTP status."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.field = field
        self.status = status


def _commands() -> dict[str, Callable]:
    from planner.cli.estimate import estimate
    from planner.cli.plan import plan
    from planner.cli.simulate import simulate

    return {"estimate": estimate, "plan": plan, "simulate": simulate}


def _runners() -> dict[str, Callable[[dict], tuple[object, dict]]]:
    """Each view's run: (what ``--json`` prints, what the drawing needs beside it)."""
    from planner.cli.simulate import simulate_run

    return {"estimate": _estimate, "plan": _plan,
            "simulate": lambda a: (simulate_run(a), {})}


def _estimate(a: dict) -> tuple[dict, dict]:
    """estimate's object, with the memory a GPU of the layout needs and whether the operators
    and memory breakdown are one TP group's (a pipeline or expert-parallel layout: its
    headline figures are the layout's, its breakdown one TP group's, as the CLI says)."""
    from planner.cli.estimate import estimate_run

    run = estimate_run(a)
    return run.payload, {"memory_per_gpu_bytes": run.res.memory_needed_per_gpu_bytes,
                         "layout_section": run.res.layout_section}


def _plan(a: dict) -> tuple[list, dict]:
    """plan's rows, with each row's layout as the table says it, the ranks on the cost-latency
    Pareto front (planner/search/plan.py) and the price set."""
    from planner.cli.plan import plan_records, plan_run
    from planner.layouts.deployment import Layout
    from planner.search.disagg import pd_label
    from planner.search.plan import pareto_front, percentile_name

    df = plan_run(a)
    rows = plan_records(df)
    feasible = df[df["meets_targets"].astype(bool)] if len(df) else df
    name = percentile_name(a["percentile"])  # parsed: every parameter is there
    return rows, {
        "layout": [pd_label(r) if r.get("disaggregated") else
                   Layout(int(r["tp"]), int(r["pp"]), int(r["ep"])).label for r in rows],
        "pareto_ranks": [int(r) for r in pareto_front(feasible)["rank"]] if len(feasible)
        else [],
        "price_set": rows[0]["price_set"] if rows else None,
        "ttft_key": f"{name}_ttft_s", "tpot_key": f"{name}_tpot_s",
    }


# The form fields of each view, in the order the command line says them.
FIELDS = {
    "estimate": ("model", "gpu", "engine", "weights", "kv_cache", "tp", "pp", "ep", "batch",
                 "prompt_tokens", "output_tokens"),
    "plan": ("model", "gpu", "engine", "ttft", "tpot", "rps", "prompt_tokens",
             "output_tokens", "tp", "pp", "ep", "weights", "kv_cache", "prices", "percentile",
             "disaggregated", "sim_requests"),
    "simulate": ("model", "gpu", "engine", "weights", "kv_cache", "tp", "pp", "ep",
                 "request_rate", "num_requests", "prompt_tokens", "output_tokens",
                 "max_num_seqs", "seed"),
}


@functools.cache
def click_command(name: str):
    """The click command typer builds for ``llmplan NAME``, over a function that keeps the
    values it is called with: the command's own parser, conversions and checks of each
    option, without running it."""
    import typer
    import typer.main

    fn = _commands()[name]

    @functools.wraps(fn)  # the same signature, annotations and so the same options
    def keep(**kw):
        return kw

    t = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    t.command(name=name)(keep)
    return typer.main.get_command(t)


def flag_of(command: str, field: str) -> str:
    """A parameter's first long option: ``prompt_tokens`` -> ``--prompt-tokens``."""
    for p in click_command(command).params:
        if p.name == field:
            return next(o for o in p.opts if o.startswith("--"))
    raise ApiError(f"llmplan: error: no field {field!r} in {command}", None)


def field_of_flag(command: str, flag: str) -> str | None:
    for p in click_command(command).params:
        if flag in p.opts or flag in getattr(p, "secondary_opts", ()):
            return p.name
    return None


def argv_of(command: str, fields: dict, model_path: str | None = None) -> list[str]:
    """The command line the fields stand for (``model_path``: the uploaded config.json, in
    place of the model field); empty fields are left out, so they take the CLI's default."""
    if not isinstance(fields, dict):
        raise ApiError("llmplan: error: the request's fields are not an object")
    unknown = sorted(set(fields) - set(FIELDS[command]))
    if unknown:
        raise ApiError(f"llmplan: error: {command} has no field {unknown[0]!r}", None)
    argv = []
    for name in FIELDS[command]:
        v = model_path if name == "model" and model_path else fields.get(name)
        if v is None or (isinstance(v, str) and not v.strip()):
            continue
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ApiError(f"llmplan: error: {flag_of(command, name)}: give a value as text",
                           name)
        if name in NAMES_ONLY and v is not model_path and _is_path(str(v)):
            raise ApiError(f"llmplan: error: {flag_of(command, name)}: the page takes a "
                           "built-in name (or an uploaded config.json), not a path on the "
                           "server", name)
        argv += [flag_of(command, name), str(v).strip()]
    return [*argv, "--json"]


NAMES_ONLY = ("model", "gpu", "engine", "prices")  # the page never reads a path a request names


def _is_path(ref: str) -> bool:
    return "/" in ref or "\\" in ref or ref.startswith(".") or ref.startswith("~") \
        or ref.lower().endswith((".json", ".yaml", ".yml")) or Path(ref).exists()


def parse(command: str, argv: list[str]) -> dict:
    """``argv`` through the command's own parser: the values the command function gets."""
    from planner.cli.flags import check_duplicates

    check_duplicates(argv)
    return click_command(command).main(args=argv, standalone_mode=False,
                                       prog_name=f"llmplan {command}")


def _cli_error(command: str, err: BaseException, values: dict,
               argv: list[str] = ()) -> ApiError | None:
    """The one line ``llmplan`` prints for ``err`` (planner/cli/app.py's forms), and the
    field it is about; None for an error that is not the user's."""
    from planner.cli.app import _click_exceptions, bad_value

    exc = _click_exceptions()
    if isinstance(err, exc["UsageError"]):
        msg = bad_value(err, list(argv)) or err.format_message().replace("Value error, ", "")
        param = getattr(err, "param", None)
        field = param.name if param is not None else _field_in(command, msg, values)
        return ApiError(f"llmplan {command}: error: {msg}", field)
    if isinstance(err, LlmplanError):
        fields = getattr(err, "fields", ())
        line = flagged(err)
        return ApiError(f"llmplan: error: {line}", fields[0] if fields else
                        _field_in(command, line, values))
    if isinstance(err, ValueError) and type(err).__name__ == "ValidationError":
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or err.title
        return ApiError(f"llmplan: error: {where}: {first['msg']}",
                        _field_in(command, where, values))
    return None


_NAMED = (("unknown model", "model"), ("config.json", "model"), ("unknown GPU", "gpu"),
          ("unknown engine", "engine"), ("price set", "prices"))


def _field_in(command: str, message: str, values: dict | None = None) -> str | None:
    """The field a message is about: of the options it names, the one whose value it quotes
    ("--ttft: 'nan' is not a time"), else the first; else what it speaks of."""
    named = [field_of_flag(command, f) for f in re.findall(r"--[a-z][a-z0-9-]*", message)]
    named = [n for n in named if n in FIELDS[command]]
    for name in named:
        if f"'{(values or {}).get(name)}'" in message:
            return name
    if named:
        return named[0]
    for words, name in _NAMED:
        if words in message and name in FIELDS[command]:
            return name
    return None


def run(command: str, body: dict) -> dict:
    """A view's request answered: the command's JSON and its command line, or an
    ``ApiError`` carrying the CLI's one-line error and the field. A view with a series
    (simulate's request rates) runs the command once per value: its JSON is the list of
    their objects, its command line a shell loop over the values."""
    if command not in FIELDS:
        raise ApiError(f"llmplan: error: no such view {command!r}", None, 404)
    if not isinstance(body, dict):
        raise ApiError("llmplan: error: the request is not a JSON object")
    fields = body.get("fields") or {}
    config = body.get("config")
    if not isinstance(fields, dict):
        raise ApiError("llmplan: error: the request's fields are not an object")
    series = SERIES.get(command)
    values = _series(fields, series) if series else [None]
    runs = [fields if v is None else {**fields, series: v} for v in values]
    with tempfile.TemporaryDirectory(prefix="llmplan-ui-") as tmp:
        model_path = _write_config(config, Path(tmp)) if config is not None else None
        # the upload stands for a file of its name in the folder the command is run in
        here = str(Path(model_path).parent) + "/" if model_path else None
        payloads, extra = [], {}
        for f in runs:
            argv = argv_of(command, f, model_path)
            try:
                payload, extra = _runners()[command](parse(command, argv))
            except Exception as err:
                api = _cli_error(command, err, f, argv)
                if api is None:
                    raise
                raise ApiError(str(api).replace(here, "") if here else str(api),
                               api.field) from None
            payloads.append(as_cli_json(payload))
    payload = payloads if series else payloads[0]
    if here:
        payload = json.loads(json.dumps(payload).replace(json.dumps(here)[1:-1], ""))
    shown_model = config["name"] if config is not None else None
    return {"json": payload, "extra": extra,
            "command": _command_line(command, fields, shown_model, series, values)}


# A field a view takes as a comma-separated list, the command run once per value.
SERIES = {"simulate": "request_rate"}
MAX_SERIES = 12


def _series(fields: dict, name: str) -> list[str]:
    text = fields.get(name)
    if not isinstance(text, str) or not text.strip():
        raise ApiError(f"llmplan: error: {flag_of('simulate', name)}: give one or more "
                       "values, comma-separated", name)
    values = [v.strip() for v in text.split(",")]
    if "" in values or len(values) > MAX_SERIES:
        raise ApiError(f"llmplan: error: {flag_of('simulate', name)}: give 1 to "
                       f"{MAX_SERIES} values, comma-separated, got {text!r}", name)
    return values


def _command_line(command: str, fields: dict, model: str | None, series: str | None,
                  values: list) -> str:
    """The command line of the inputs: a shell loop where a series has several values."""
    if series is None or len(values) == 1:
        f = fields if series is None else {**fields, series: values[0]}
        return f"llmplan {command} " + shlex.join(argv_of(command, f, model))
    mark = "VALUE_OF_THE_LOOP"
    line = shlex.join(argv_of(command, {**fields, series: mark}, model))
    var = series.split("_")[-1]
    return (f"for {var} in {' '.join(shlex.quote(v) for v in values)}; do llmplan {command} "
            + line.replace(mark, f'"${var}"') + "; done")


def _write_config(config: object, folder: Path) -> str:
    """An uploaded config.json written where the catalog reads it, under its own name."""
    if not isinstance(config, dict) or not isinstance(config.get("text"), str):
        raise ApiError("llmplan: error: the uploaded config is not a file's text", "model")
    name = config.get("name") or "config.json"
    if not isinstance(name, str) or not UPLOAD_NAME.fullmatch(name):
        raise ApiError("llmplan: error: --model: an uploaded file's name must end in .json "
                       "and be letters, digits, '.', '_' or '-'", "model")
    data = config["text"].encode("utf-8", "surrogatepass")
    if len(data) > SPEC_BYTES:  # the CLI's own words for a file that large
        raise ApiError(f"llmplan: error: {name}: {len(data) / MiB:,.1f} MiB, larger than the "
                       f"{SPEC_BYTES // MiB} MiB a file may be", "model")
    # in a folder named as the CLI names a config.json with no folder (its stem), so the
    # model's name is the same (planner/io/catalog.py: _name_or_path, else folder, else stem)
    (folder / Path(name).stem).mkdir()
    path = folder / Path(name).stem / name
    path.write_bytes(data)
    return str(path)


def as_cli_json(obj: object) -> object:
    """The object as ``--json`` prints it (planner/cli/options.py's ``json_text``), read
    back."""
    from planner.cli.options import json_text

    return json.loads(json_text(obj))


def meta() -> dict:
    """What the forms offer: the built-in names, the choices and defaults, the limits."""
    from planner.cli.calls import command_defaults
    from planner.cli.options import DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, KVOpt, WeightsOpt
    from planner.io import catalog

    defaults = {cmd: {k: _plain(v) for k, v in command_defaults(fn).items()
                      if k in FIELDS[cmd]} for cmd, fn in _commands().items()}
    # simulate's -p / -o stay None until its stream is drawn; its form offers the random
    # dataset alone, whose lengths are the default workload's
    sim = defaults.get("simulate", {})
    for k, v in (("prompt_tokens", DEFAULT_PROMPT_TOKENS),
                 ("output_tokens", DEFAULT_OUTPUT_TOKENS)):
        if sim.get(k) is None:
            sim[k] = v
    return {
        "models": catalog.model_names(), "gpus": catalog.gpu_names(),
        "engines": list(dict.fromkeys(["ideal", *catalog.engine_names()])),
        "weights": [w.value for w in WeightsOpt], "kv_cache": [k.value for k in KVOpt],
        "prices": catalog.price_set_names(), "default_prices": catalog.price_set().name,
        "defaults": defaults,
        "max_upload_bytes": SPEC_BYTES, "max_body_bytes": MAX_BODY_BYTES,
    }


def _plain(v: object) -> object:
    """A default as the form shows it: an enum's value, inf as "inf" (JSON has no inf)."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return getattr(v, "value", v)
