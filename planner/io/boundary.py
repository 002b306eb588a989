"""The input boundary: every structured file llmplan reads passes here first.

Checks run before a parser builds anything, so that no input can reach a parser's recursion
(libyaml's composer recurses in C: a file 50,000 levels deep was a segmentation fault on
builds without libyaml's own limit; Python's composer and pydantic's walk of a 1,000-deep
budget were RecursionErrors):

- the path is a regular file, by ``os.stat`` before anything opens it (a named pipe would block
  the read forever, a device never end);
- the file is no larger than its kind's limit (``SPEC_BYTES``, ``DATASET_BYTES``,
  ``RESULT_BYTES``);
- nesting is at most ``MAX_DEPTH`` levels: for YAML by walking libyaml's event stream (its
  parser keeps explicit stacks, it does not recurse), aliases counted at the depth they
  expand to; for JSON by a scan of the brackets outside strings;
- numbers have at most ``MAX_DIGITS`` digits, and a finite literal that overflows a float
  (``1.0e999``) is refused, naming the field where the format lets us know it.

Each refusal is a ``SpecError``: one line naming the file and the limit.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from planner.core.errors import SpecError

MiB = 2**20
# The largest shipped files: a spec 32 KB (engines_db/vllm-0.8.yaml), a dataset or manifest
# 132 KB (planner/data/served/gpustack-perf-lab.yaml), a result file 214 KB (a GuideLLM
# report); real benchmark dumps with per-request arrays reach tens of MiB.
SPEC_BYTES = 4 * MiB
DATASET_BYTES = 32 * MiB
RESULT_BYTES = 200 * MiB
MAX_DEPTH = 64  # the deepest shipped file nests 6
MAX_DIGITS = 30  # a float has 17 significant digits; no count we read needs more than 20


def _short(path: Path | str) -> str:
    ref = str(path)
    return ref if len(ref) <= 240 else ref[:80] + "..."


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "something else"


def regular_file(path: Path | str, what: str = "file") -> os.stat_result:
    """``path``'s stat if it is a regular file (links followed); otherwise a ``SpecError``
    saying what it is. Nothing is opened."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise SpecError(f"{_short(path)}: no such file (cannot read the {what})") from None
    except (OSError, ValueError) as err:  # a name too long, a NUL byte, no permission
        raise SpecError(f"{_short(path)}: not a usable {what} path "
                        f"({getattr(err, 'strerror', None) or err})") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise SpecError(f"{_short(path)}: is {kind}, not a regular file; give a {what}")
    return st


def read_text(path: Path | str, *, what: str = "file", max_bytes: int = SPEC_BYTES) -> str:
    """A regular file's UTF-8 text, no larger than ``max_bytes``; otherwise a ``SpecError``."""
    st = regular_file(path, what)
    if st.st_size > max_bytes:
        raise SpecError(f"{_short(path)}: {st.st_size / MiB:,.1f} MiB, larger than the "
                        f"{max_bytes // MiB} MiB a {what} may be")
    try:  # O_NONBLOCK: were the path swapped for a pipe since the stat, open does not wait
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise SpecError(f"{_short(path)}: cannot read: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if _kind(os.fstat(fd).st_mode) is not None:
            raise SpecError(f"{_short(path)}: not a regular file; give a {what}")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SpecError(f"{_short(path)}: larger than the {max_bytes // MiB} MiB a {what} "
                        "may be")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"{_short(path)}: not UTF-8 text (byte {err.start}: "
                        f"{data[err.start:err.start + 1]!r})") from None


# --------------------------------------------------------------------------------- YAML

_RESOLVER = yaml.resolver.Resolver()
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_NUMBER_START = frozenset("+-.0123456789")


def _number_problem(value: str, tag: str) -> str | None:
    digits = sum(c.isdigit() for c in value)
    if digits > MAX_DIGITS:
        return f"a number of {digits:,} digits (at most {MAX_DIGITS})"
    if tag == _FLOAT_TAG and any(c.isdigit() for c in value):
        try:
            x = float(value.replace("_", ""))
        except ValueError:  # sexagesimal (1:30.5): small by construction
            return None
        if math.isinf(x):
            return f"{value} is beyond a float's range"
    return None


class _Frame:
    __slots__ = ("is_map", "key", "want_key", "depth", "deepest", "anchor", "lines")

    def __init__(self, is_map: bool, depth: int, anchor: str | None):
        self.is_map, self.depth, self.anchor = is_map, depth, anchor
        self.key: Any = None if is_map else 0
        self.want_key = is_map
        self.deepest = depth
        self.lines: dict[str, int] = {}  # a mapping's keys so far -> the line of each


def check_yaml(text: str, path: Path | str) -> None:
    """Refuse a YAML text nested deeper than ``MAX_DEPTH`` (aliases counted where they
    expand), holding a number of more than ``MAX_DIGITS`` digits, or giving a mapping's key
    twice (a YAML loader keeps the last silently: a deleted line merges two entries into
    one), before it is composed."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    stack: list[_Frame] = []
    anchors: dict[str, int] = {}  # anchor -> levels its node spans

    def field() -> str:
        return ".".join(str(f.key) for f in stack if f.key is not None) or "(top level)"

    def done(key: Any = "?") -> None:  # a node ended: move its parent on
        if not stack:
            return
        f = stack[-1]
        if not f.is_map:
            f.key += 1
        elif f.want_key:
            f.key, f.want_key = key, False
        else:
            f.want_key = True

    def reach(depth: int, mark) -> None:
        if depth > MAX_DEPTH:
            raise SpecError(f"{_short(path)}:{mark.line + 1}: nested more than {MAX_DEPTH} "
                            "levels deep (the most a file may nest)")
        if stack:
            stack[-1].deepest = max(stack[-1].deepest, depth)

    for ev in yaml.parse(text, Loader=loader):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth = len(stack) + 1
            reach(depth, ev.start_mark)
            stack.append(_Frame(isinstance(ev, yaml.MappingStartEvent), depth, ev.anchor))
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            f = stack.pop()
            if f.anchor is not None:
                anchors[f.anchor] = f.deepest - f.depth + 1
            if stack:
                stack[-1].deepest = max(stack[-1].deepest, f.deepest)
            done()
        elif isinstance(ev, yaml.AliasEvent):
            here = stack[-1].depth if stack else 0
            reach(here + anchors.get(ev.anchor, 0), ev.start_mark)
            done()
        elif isinstance(ev, yaml.ScalarEvent):
            if stack and stack[-1].is_map and stack[-1].want_key and ev.value != "<<":
                first = stack[-1].lines.setdefault(ev.value, ev.start_mark.line + 1)
                if first != ev.start_mark.line + 1:
                    parent = ".".join(str(f.key) for f in stack[:-1] if f.key is not None)
                    raise SpecError(f"{_short(path)}:{ev.start_mark.line + 1}: "
                                    f"{parent + '.' if parent else ''}{ev.value}: given twice "
                                    f"(first on line {first})")
            # plain (libyaml says "", Python None), and where YAML 1.1 could read a number:
            # every int and float form begins with a sign, a digit or a point
            if not ev.style and ev.implicit[0] and ev.value[:1] in _NUMBER_START:
                tag = _RESOLVER.resolve(yaml.ScalarNode, ev.value, (True, False))
                if tag in (_INT_TAG, _FLOAT_TAG):
                    problem = _number_problem(ev.value, tag)
                    if problem:
                        raise SpecError(f"{_short(path)}:{ev.start_mark.line + 1}: "
                                        f"{field()}: {problem}")
            done(ev.value)


# --------------------------------------------------------------------------------- JSON

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_PAIR = re.compile(r"\[\]|\{\}")


def check_json_depth(text: str, where: str) -> None:
    """Refuse JSON (or JSON Lines) nested deeper than ``MAX_DEPTH``: each pass removes the
    innermost bracket pairs, so a text that still has a pair after ``MAX_DEPTH`` passes
    nests deeper. Strings are taken out first; unbalanced brackets are left to the parser."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    for _ in range(MAX_DEPTH):
        brackets, n = _PAIR.subn("", brackets)
        if n == 0:
            return
    if _PAIR.search(brackets):
        raise SpecError(f"{where}: nested more than {MAX_DEPTH} levels deep (the most a file "
                        "may nest)")


def _json_number(where: str, text: str):
    def line_of(s: str) -> str:
        """The number's line and, where a key precedes it, the key: ":3: max_tokens"."""
        i = text.find(s)
        if i < 0:
            return ""
        key = re.search(r'"([^"\\]{1,80})"\s*:\s*$', text[max(0, i - 200):i])
        return f":{text.count(chr(10), 0, i) + 1}" + (f": {key.group(1)}" if key else "")

    def parse_int(s: str) -> int:
        if len(s) - s.startswith("-") > MAX_DIGITS:
            raise SpecError(f"{where}{line_of(s)}: a number of {len(s.lstrip('-')):,} digits "
                            f"(at most {MAX_DIGITS})")
        return int(s)

    def parse_float(s: str) -> float:
        problem = _number_problem(s, _FLOAT_TAG)
        if problem:
            raise SpecError(f"{where}{line_of(s)}: {problem}")
        return float(s)

    return parse_int, parse_float


def loads_json(text: str, where: str, *, checked: bool = False) -> Any:
    """``json.loads`` behind the boundary: nesting and number limits (``SpecError``); a
    malformed document still raises ``json.JSONDecodeError`` for the caller to word.
    ``checked``: the depth of the whole text was already checked (JSON Lines)."""
    if not checked:
        check_json_depth(text, where)
    parse_int, parse_float = _json_number(where, text)
    return json.loads(text, parse_int=parse_int, parse_float=parse_float)
