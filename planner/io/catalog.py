"""Find and load specs: the built-in databases, YAML files of the same schema, and Hugging Face
``config.json`` files. Every problem becomes a ``SpecError`` whose one-line message names the
file, the field and what is wrong.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError

from planner.core.engine import Engine, EngineSpec
from planner.core.errors import SpecError
from planner.core.specs import (
    INDEXER_FIELDS,
    Calibration,
    HardwareSpec,
    ModelSpec,
    moe_layer_range,
)
from planner.io import boundary

_HERE = Path(__file__).resolve().parent.parent  # planner/
S = TypeVar("S", bound=BaseModel)


def db_dir(kind: str) -> Path:
    """``models_db``, ``hardware_db`` or ``engines_db``: the checkout's own (editable
    installs, a clone), or the copy a wheel carries inside the package (``pip install .``)."""
    for candidate in (_HERE.parent / kind, _HERE / "_data" / kind):
        if candidate.is_dir():
            return candidate
    raise SpecError(f"{kind}/ not found beside the planner package nor inside it")


def _names(kind: str) -> list[str]:
    return sorted(p.stem for p in db_dir(kind).glob("*.yaml"))


def model_names() -> list[str]:
    return _names("models_db")


def gpu_names() -> list[str]:
    return _names("hardware_db")


def engine_names() -> list[str]:
    return _names("engines_db")


def format_validation(path: str, err: ValidationError, *, within: str = "",
                      names: dict[str, str] | None = None) -> str:
    """A validation error as one line: ``path``, then up to three fields' problems, each
    field's path under ``within`` (where the validated mapping sits in its file)."""
    from planner.core.prices import ENTRY_TAGS  # a price entry's kind: not a key in the file

    errors = err.errors()
    # a list whose item failed is also "too short after validation": that one says nothing
    errors = [e for e in errors if e["type"] != "too_short" or not any(
        o is not e and tuple(o["loc"][:len(e["loc"])]) == tuple(e["loc"]) for o in errors)]
    parts = []
    for e in errors[:3]:
        loc = ".".join([*filter(None, [within]),
                        *(str(x) for x in e["loc"] if x not in ENTRY_TAGS)])
        loc = (names or {}).get(loc, loc)  # the key as the file spells it
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (misspelled?)"
        elif e["type"] == "missing":
            msg = "missing required field"
        elif e["type"] == "too_short":
            ctx = e.get("ctx") or {}
            n = ctx.get("min_length", 1)
            msg = f"needs at least {n} item{'s' if n != 1 else ''}, got " \
                  f"{ctx.get('actual_length', 0)}"
        elif e["type"] in ("model_type", "model_attributes_type", "dict_type"):
            msg = f"expected a mapping of fields, got {_shown(e.get('input'))}"
        elif (e["type"].endswith(("_parsing", "_type")) or e["type"] in _RANGE_ERRORS) \
                and "input" in e:
            msg += f", got {_shown(e['input'])}"  # the value, as the file gave it
        for ours, theirs in (names or {}).items():  # a whole-model check's words too
            if "." not in ours:
                msg = re.sub(rf"\b{ours}\b", theirs, msg)
        parts.append(f"{loc}: {msg}" if loc else msg)  # a whole-file check names its fields
    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
    return f"{path}: " + "; ".join(parts) + more


_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal",
                 "finite_number", "multiple_of")


def _shown(v: Any) -> str:
    """A value a file gave, short: a number, a quoted string or its kind."""
    if v is None:
        return "nothing (null)"
    if isinstance(v, dict | list | tuple):
        kind = "mapping" if isinstance(v, dict) else "list"
        return f"an empty {kind}" if not v else \
            f"a {kind} of {len(v)} item{'s' if len(v) != 1 else ''}"
    return f"{v!r:.40}"


def validate(cls: type[S], data: Any, path: str, names: dict[str, str] | None = None) -> S:
    if not isinstance(data, dict):
        got = "no fields (the file is empty, only comments, or null)" if data is None \
            else _shown(data)
        raise SpecError(f"{path}: expected a mapping of fields (key: value lines), got {got}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise SpecError(format_validation(path, err, names=names)) from None


def read_text(path: Path, *, what: str = "file", max_bytes: int = boundary.SPEC_BYTES) -> str:
    """A regular file's UTF-8 text, within its kind's size, or a ``SpecError`` naming the
    file and what is wrong (``planner.io.boundary``)."""
    return boundary.read_text(path, what=what, max_bytes=max_bytes)


def read_json(path: Path, *, what: str = "file", max_bytes: int = boundary.SPEC_BYTES) -> Any:
    """A JSON document: malformed, too deep or with a number too long is one line."""
    text = read_text(path, what=what, max_bytes=max_bytes)
    try:
        return boundary.loads_json(text, str(path))
    except json.JSONDecodeError as err:
        where = f" line {err.lineno} column {err.colno}" if err.msg.endswith(" at") else ""
        raise SpecError(f"{path}: line {err.lineno}: malformed JSON: {err.msg}{where}") from None
    except RecursionError:
        raise SpecError(f"{path}: JSON nested too deeply") from None
    except ValueError as err:
        raise SpecError(f"{path}: malformed JSON: {str(err).splitlines()[0]}") from None


# An alias repeats a node: a "billion laughs" file of aliases of aliases stands for an
# exponential number of nodes, which validating it would walk. No spec comes near this many.
MAX_YAML_NODES = 1_000_000


def _expanded_nodes(node, memo: dict) -> int:
    """Nodes of a composed YAML graph with every alias expanded (memoized: linear work)."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a self-reference counts once
        children = node.value if isinstance(node.value, list) else []
        total = 1
        for c in children:
            for n in (c if isinstance(c, tuple) else (c,)):
                total += _expanded_nodes(n, memo)
        memo[key] = total
    return memo[key]


def read_yaml(path: Path, *, what: str = "file", max_bytes: int = boundary.SPEC_BYTES) -> Any:
    """A YAML document behind the input boundary: a regular file within its size, nested at
    most ``boundary.MAX_DEPTH`` deep, no number too long, aliases that expand to at most
    ``MAX_YAML_NODES`` nodes; anything else is one line."""
    return _parse_yaml(read_text(path, what=what, max_bytes=max_bytes), path)


# Specs already read, by class, path and the text's digest: `validate` replays hundreds of
# runs, each loading its GPU, model and engine profile (and every profile of the engine's
# family to pick the release's), and parsing the YAML was a quarter of its time. Keyed by
# the text, so an edited file is read again; the objects are frozen. Bounded: a process
# that reads many distinct files (a fuzzer) keeps only the newest.
_SPECS: dict[tuple[type, str, str], Any] = {}
_SPECS_MAX = 512


def _load_spec(cls: type[S], path: Path, build: Callable[[Any, str], S] | None = None) -> S:
    """``cls`` validated from the YAML file at ``path`` (by ``build`` where given), once per
    distinct text."""
    text = read_text(path)
    key = (cls, str(path), hashlib.blake2b(text.encode(), digest_size=16).hexdigest())
    spec = _SPECS.get(key)
    if spec is None:
        data = _parse_yaml(text, path)
        spec = validate(cls, data, str(path)) if build is None else build(data, str(path))
        if len(_SPECS) >= _SPECS_MAX:
            _SPECS.clear()
        _SPECS[key] = spec
    return spec


def _parse_yaml(text: str, path: Path) -> Any:
    """``read_yaml``'s checks and parse of a text already read from ``path``."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where the wheel has it
    try:
        boundary.check_yaml(text, path)  # before anything is composed
        if "*" in text:  # size the graph, aliases expanded, before building anything
            n = _expanded_nodes(yaml.compose(text, Loader=loader), {})
            if n > MAX_YAML_NODES:
                raise SpecError(f"{path}: its YAML aliases expand to {n:,} nodes "
                                f"(at most {MAX_YAML_NODES:,})")
        return yaml.load(text, Loader=loader)
    except RecursionError:
        raise SpecError(f"{path}: YAML nested too deeply") from None
    except ValueError as err:  # a scalar YAML resolves but Python cannot build
        raise SpecError(f"{path}: unreadable value: {str(err).split(';')[0]}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        if isinstance(err, yaml.reader.ReaderError):  # a character YAML does not allow
            line = text.count("\n", 0, err.position) + 1
        where = f" line {line}:" if line is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(f"{path}:{where} malformed YAML: {problem}") from None


def is_file(p: Path, what: str) -> bool:
    """Whether ``p`` is a regular file: False if nothing or a directory is there (a name may
    still mean a built-in entry); a named pipe or a device there, or a path the OS refuses to
    look up (a name too long, a NUL byte), is a ``SpecError`` naming ``what`` it was meant to
    be. Nothing is opened."""
    try:
        if os.path.isdir(p):
            return False
        os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except (OSError, ValueError):
        pass  # regular_file words it
    boundary.regular_file(p, what)
    return True


def _resolve(ref: str, kind: str, what: str) -> Path:
    if not ref.strip():
        raise SpecError(f"no {what} given")
    p = Path(ref)
    if p.suffix in (".yaml", ".yml", ".json"):
        if not is_file(p, f"{what} file") and not os.path.isdir(p):
            raise SpecError(f"{ref}: no such file")
        boundary.regular_file(p, f"{what} file")  # a directory, a pipe: one line
        return p
    if is_file(p, what):
        return p
    known = _names(kind)
    if ref in known:
        return db_dir(kind) / f"{ref}.yaml"
    folded = {k.casefold(): k for k in known}  # H100-SXM, Llama-3.1-8B: the same entries
    if ref.casefold() in folded:
        return db_dir(kind) / f"{folded[ref.casefold()]}.yaml"
    close = difflib.get_close_matches(ref.casefold(), known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    lister = {"models_db": "models", "hardware_db": "gpus", "engines_db": "engines"}[kind]
    raise SpecError(f"unknown {what} '{ref}' (not a file, not in {kind}/){hint} "
                    f"(llmplan {lister} lists them)")


def load_model(ref: str) -> ModelSpec:
    """A built-in model name, a YAML file, a Hugging Face ``config.json``, or a folder holding
    one (a downloaded snapshot: the model is named by ``_name_or_path`` or the folder)."""
    folder = Path(ref)
    try:
        is_dir = bool(ref.strip()) and folder.is_dir()
    except (OSError, ValueError):
        is_dir = False  # _resolve names the problem
    if is_dir:
        cfg = folder / "config.json"
        if not is_file(cfg, "model"):
            raise SpecError(f"{ref}: a folder without a config.json (a Hugging Face snapshot "
                            "holds one)")
        return model_from_hf_config(read_json(cfg, what="model config"), str(cfg))
    path = _resolve(ref, "models_db", "model")
    if path.suffix == ".json":
        return model_from_hf_config(read_json(path), str(path))
    return _load_spec(ModelSpec, path, build=_model_of_yaml)


def _model_of_yaml(data: Any, path: str) -> ModelSpec:
    """A model file's spec. Its ``quantization_config`` (with ``torch_dtype``, where the
    config has one), copied verbatim from the official config.json its ``source`` names,
    says how the checkpoint stores its weights, read as a config.json's is
    (planner/io/quant_config.py): a built-in model and its own config.json give the same
    default precision. A block the reader cannot use is named with this file's path when
    the precision is taken from it, as a config.json's is."""
    from planner.io.quant_config import FIELD, checkpoint_half, model_checkpoint_quant

    raw = data.get("torch_dtype") if isinstance(data, dict) else None
    if raw in ("float16", "bfloat16", "float32"):
        # a config.json's spelling, read as a config.json's is (float32: no 16-bit type)
        half = checkpoint_half(data)
        data = {**data, "torch_dtype": None if half is None else half.value}
    if not isinstance(data, dict) or FIELD not in data:
        return validate(ModelSpec, data, path)
    data = dict(data)
    qc = data.pop(FIELD)
    m = validate(ModelSpec, data, path)
    # the quantization_config reader takes the 16-bit type as the config spells it
    half = {"fp16": "float16", "bf16": "bfloat16"}.get(raw, raw)
    cfg = {FIELD: qc} if half is None else {FIELD: qc, "torch_dtype": half}
    q = model_checkpoint_quant(cfg, path, m)
    if q is None:  # "quantization_config: null": none, as in a config.json
        return m
    if q.problem is None and m.source.endswith("config.json"):
        q = q.model_copy(update={"file": m.source})  # the config the block was copied from
    return m.model_copy(update={"quantization": q})


def load_hardware(ref: str, prices: str | None = None,
                  price_overrides: dict[str, float] | None = None) -> HardwareSpec:
    """A built-in GPU name or a YAML file, priced on one basis: the price set ``prices``
    (``load_price_set``; None: ``DEFAULT_PRICES``) with any ``--price GPU=USD`` overrides
    (``priced``). A GPU the set does not sell has no price (``price_reason`` says why)."""
    path = _resolve(ref, "hardware_db", "GPU")
    hw = _load_spec(HardwareSpec, path)
    return priced(hw, price_set(prices), price_overrides)[0]


def load_engine_spec(ref: str) -> EngineSpec:
    """A built-in engine profile name (engines_db/), ``FAMILY@VERSION`` (``vllm@0.6.3``: the
    built-in profile whose ``versions`` cover that release), or a YAML file of the same
    schema."""
    if "@" in ref and Path(ref).suffix not in (".yaml", ".yml", ".json"):
        return _engine_for_version(ref)
    path = _resolve(ref, "engines_db", "engine")
    spec = _load_spec(EngineSpec, path)
    if spec.release is not None:
        raise SpecError(f"{path}: release: set by --engine FAMILY@RELEASE, not in a profile "
                        "file (versions states the releases a profile covers)")
    return spec


def _engine_for_version(ref: str) -> EngineSpec:
    from planner.core.engine import release_number, version_key

    family, _, version = ref.partition("@")
    try:  # a published name (1.2.0rc1, 0.5.3.post3, v0.8.2) is read as its release
        version = release_number(version)
    except ValueError as e:
        raise SpecError(f"--engine {ref}: {e}") from None
    specs = [load_engine_spec(n) for n in _names("engines_db")]
    mine = [s for s in specs if s.versions is not None
            and s.versions.family.casefold() == family.casefold()]
    if not mine:
        families = sorted({s.versions.family for s in specs if s.versions is not None})
        raise SpecError(f"--engine {ref}: no profile of an engine called '{family}' states the "
                        f"releases it covers (engines with versions: {', '.join(families)})")
    for s in mine:
        if s.versions.covers(version):  # the release named where the profile is printed
            return s.at_version(version).model_copy(update={
                "engine_version": f"release {version}; {s.engine_version}", "release": version})
    spans = "; ".join(f"{s.name}: {s.versions.from_} - {s.versions.until or 'latest'}"
                      for s in sorted(mine, key=lambda s: version_key(s.versions.from_)))
    raise SpecError(f"--engine {ref}: no {family} profile covers release {version} ({spans})")


def load_engine(ref: str) -> Engine:
    return load_engine_spec(ref).model()


VALIDATION_DIR = _HERE / "data" / "validation"


def load_datasets(paths: list[Path] | None = None) -> list:
    """The built-in validation datasets (planner/data/validation/*.yaml), or ``paths``."""
    from planner.evidence.validate import Dataset

    files = paths if paths else sorted(VALIDATION_DIR.glob("*.yaml"))
    out = []
    for f in files:
        p = Path(f)
        data = read_yaml(p, what="dataset file", max_bytes=boundary.DATASET_BYTES)
        out.append(validate(Dataset, data, str(p)))
    ids = [d.source.id for d in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SpecError(f"validation datasets: source id {', '.join(dup)} appears twice")
    return out


SERVED_DIR = _HERE / "data" / "served"


def load_served(paths: list[Path] | None = None) -> list:
    """The built-in served-run manifests (planner/data/served/*.yaml), or ``paths``: each
    (ServedDataset, the folder its result files lie in)."""
    from planner.evidence.served import ServedDataset

    files = paths if paths is not None else sorted(SERVED_DIR.glob("*.yaml"))
    out = []
    for f in files:
        p = Path(f)
        data = read_yaml(p, what="served-run manifest", max_bytes=boundary.DATASET_BYTES)
        out.append((validate(ServedDataset, data, str(p)), p.parent))
    ids = [d.source.id for d, _ in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SpecError(f"served-run manifests: source id {', '.join(dup)} appears twice")
    return out


def yaml_line(text: str, loc: tuple) -> int | None:
    """The line (1-based) of the node at ``loc`` (keys and list indices) in a YAML text, or
    of its nearest ancestor that exists."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = node.start_mark.line + 1 if node is not None else None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next(((k, v) for k, v in node.value if k.value == str(key)), None)
            if nxt is None:
                break
            line, node = nxt[0].start_mark.line + 1, nxt[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) \
                and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line


def load_budget(path: str | Path):
    """A budget file, validated; errors name the file, the line and the field."""
    from planner.evidence.budget import Budget

    p = Path(path)
    data = read_yaml(p, what="budget file")
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping with a 'deployments' list")
    try:
        return Budget.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function")))
        line = yaml_line(read_text(p), loc)
        where = f":{line}" if line else ""
        field = ".".join(str(x) for x in loc) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (misspelled?)"
        elif e["type"] == "missing":
            msg = "missing required field"
        more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
        raise SpecError(f"{p}{where}: {field}: {msg}{more}") from None


def load_calibration(path: str | Path) -> Calibration:
    p = Path(path)
    read = read_json if p.suffix == ".json" else read_yaml
    data = read(p, what="calibration file")
    return validate(Calibration, data, str(p))


# --------------------------------------------------------------------------- HF config.json

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma",
                         "gemma2", "gemma3", "gemma3_text", "phi3", "gpt2", "gpt_oss",
                         "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe",
                         "glm_moe_dsa", "minimax_m2", "qwen3_vl", "qwen3_vl_moe", "llama4_text")
# The model classes of those architectures as a config.json's ``architectures`` names them.
# vLLM's model registry and SGLang's pick the model's code by this name, not by model_type, so
# a checkpoint under a model_type of its own whose class is one of these runs as that
# architecture (moonshotai/Kimi-K2-Instruct: model_type kimi_k2, DeepseekV3ForCausalLM) and is
# read here as it.
ARCHITECTURE_CLASSES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3", "GPT2LMHeadModel": "gpt2", "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32", "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    "Glm4MoeForCausalLM": "glm4_moe", "MiniMaxM2ForCausalLM": "minimax_m2",
    "Llama4ForCausalLM": "llama4_text",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe"}
# the model types read as DeepSeek's multi-head latent attention and mixture of experts, and
# of those the ones with DeepSeek Sparse Attention's indexer (DeepSeek-V3.2, GLM-5)
SPARSE_MLA_TYPES = ("deepseek_v32", "glm_moe_dsa")
MLA_TYPES = ("deepseek_v2", "deepseek_v3", *SPARSE_MLA_TYPES)
# Qwen3-VL's language model is Qwen3's (dense or MoE), in its config's text_config
QWEN3_VL_TEXT = {"qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_moe"}
# what ``_modelled_type`` answers for another multimodal checkpoint whose text_config is a
# language model modelled here (moonshotai/Kimi-K2.5: kimi_k25 around a DeepseekV3ForCausalLM)
TEXT_WRAPPER = "text_config"
# transformers' Gemma3TextConfig defaults: the official multimodal configs leave these out of
# text_config (google/gemma-3-27b-it's states only the sizes that differ).
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                        "num_hidden_layers": 26, "num_attention_heads": 8,
                        "num_key_value_heads": 4, "head_dim": 256,
                        "max_position_embeddings": 131072, "sliding_window": 4096,
                        "sliding_window_pattern": 6, "tie_word_embeddings": True}
_LAYER_KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def _period(kinds: list[str]) -> tuple[str, ...]:
    """The shortest prefix that, repeated, gives the whole per-layer list."""
    for p in range(1, len(kinds) + 1):
        if all(k == kinds[i % p] for i, k in enumerate(kinds)):
            return tuple(kinds[:p])
    return tuple(kinds)  # unreachable: p = len(kinds) always matches


def _sliding_window(cfg: dict, mt: str, layers: int, path: str) -> dict[str, Any]:
    """The sliding window as the engines read the config (transformers' modeling code, which
    vLLM follows): an explicit ``layer_types`` list first; else Gemma-2 slides on even layers,
    Gemma-3 on all but every ``sliding_window_pattern``-th, Qwen2/3 on the layers from
    ``max_window_layers`` when ``use_sliding_window``, and the rest (Mistral, Mixtral, Phi-3) on
    every layer whenever ``sliding_window`` is set."""
    window = cfg.get("sliding_window")
    first = cfg.get("max_window_layers")
    first = 0 if first is None else first  # absent or null: transformers' default applies
    if mt in ("qwen2", "qwen3", "qwen3_moe") and (
            not isinstance(first, int) or isinstance(first, bool) or first < 0):
        # checked where it does not apply too: a layer count that is not one is a corrupt file
        raise SpecError(f"{path}: max_window_layers: expected a whole number")
    if mt in ("qwen2", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window"):
        return {}
    if not window or mt in ("llama", "gpt2", "gemma", "glm4_moe", "minimax_m2",
                            "llama4_text", *MLA_TYPES):
        return {}
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or any(
                t not in _LAYER_KINDS for t in types):
            raise SpecError(f"{path}: layer_types: expected {layers} entries, each "
                            f"{' or '.join(_LAYER_KINDS)}")
        kinds = [_LAYER_KINDS[t] for t in types]
    elif mt == "gemma2":
        kinds = ["sliding", "full"]
    elif mt in ("gemma3", "gemma3_text"):
        n = cfg.get("sliding_window_pattern") or 6
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise SpecError(f"{path}: sliding_window_pattern: expected a positive whole number")
        kinds = ["sliding"] * (n - 1) + ["full"]
    elif mt in ("qwen2", "qwen3", "qwen3_moe"):
        kinds = ["full" if i < first else "sliding" for i in range(layers)]
    else:
        kinds = ["sliding"]
    if "sliding" not in kinds:
        return {}
    pattern = _period(kinds)
    return {"sliding_window": window,
            **({} if pattern == ("sliding",) else {"sliding_window_pattern": list(pattern)})}


def _req(cfg: dict, key: str, path: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise SpecError(f"{path}: {key}: missing required field for "
                        f"model_type {cfg.get('model_type')}")
    return cfg[key]


def _opt_int(cfg: dict, key: str, path: str, default: Any, *, least: int = 1) -> Any:
    """An optional whole-number field: absent or null takes ``default`` (as transformers'
    configs do); anything else must be a whole number of at least ``least``. Not read as
    "falsy means absent": a 0, [] or "" num_key_value_heads had become full multi-head
    attention, 8x the KV cache, with exit 0."""
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise SpecError(f"{path}: {key}: expected a whole number >= {least} (or null), "
                        f"got {v!r:.40}")
    return v


def _opt_bool(cfg: dict, key: str, path: str, default: bool) -> bool:
    """An optional true / false field: absent or null takes ``default``."""
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise SpecError(f"{path}: {key}: expected true or false (or null), got {v!r:.40}")
    return v


def _qwen_moe_layer(cfg: dict, i: int, path: str) -> bool:
    """Whether layer i of a Qwen3-MoE config is sparse (transformers' Qwen3MoeDecoderLayer)."""
    step = cfg.get("decoder_sparse_step", 1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(step, int) or isinstance(step, bool) or step < 1 or not isinstance(
            only, list):
        raise SpecError(f"{path}: decoder_sparse_step / mlp_only_layers: expected a positive "
                        "whole number and a list of layer indices")
    return i not in only and (i + 1) % step == 0


def _moe_layout(sparse: list[int], layers: int, step: int) -> tuple[int | None, int]:
    """(first_dense_layers, layer_step) whose MoE layers (``ModelSpec.is_moe_layer``) are
    exactly ``sparse``, from the config's step or as the last layers; (None, 1) where
    neither gives them."""
    if not sparse:
        return layers, 1
    for first, s in ((sparse[0] - (step - 1), step), (layers - len(sparse), 1)):
        if 0 <= first <= layers and list(moe_layer_range(layers, first, s)) == sparse:
            return first, s
    return None, 1


def model_from_hf_config(cfg: dict, path: str) -> ModelSpec:
    """Translate the fields of an official HF config into a ``ModelSpec``, with how the
    checkpoint stores its weights (``quantization_config``: planner/io/quant_config.py)."""
    from planner.io.quant_config import checkpoint_half, model_checkpoint_quant

    _modelled_type(cfg, path)  # an architecture not modelled is the first thing to say
    text = cfg.get("text_config")
    if isinstance(text, dict) and "quantization_config" not in cfg and \
            "quantization_config" in text:
        # a vision-language checkpoint whose language model states how it is stored
        # (Kimi-K2.5's int4 experts): read as the checkpoint's
        cfg = {**cfg, "quantization_config": text["quantization_config"]}
    bad = _non_finite(cfg)
    if bad is not None:  # JSON has no NaN or Infinity; Python's reader lets them through
        field, value = bad
        raise SpecError(f"{path}: {field}: {value} is not a number a config can hold")
    try:
        m = _model_from_hf_config(cfg, path)
    except (TypeError, OverflowError) as err:  # a list or a string where a size belongs
        raise SpecError(f"{path}: a size field is not a number ({err})") from None
    key = "torch_dtype" if "torch_dtype" in cfg else "dtype"
    t = cfg.get(key)
    if t is not None and t not in TORCH_DTYPES:  # "float7" had been read as no type given
        raise SpecError(f"{path}: {key}: expected a torch type name "
                        f"({', '.join(TORCH_DTYPES[:3])}, ...), got {t!r:.40}")
    q = model_checkpoint_quant(cfg, path, m)
    half = checkpoint_half(cfg)
    if half is not None:
        m = m.model_copy(update={"torch_dtype": half.value})
    return m if q is None else m.model_copy(update={"quantization": q})


def _non_finite(node: Any, at: str = "") -> tuple[str, float] | None:
    """The first NaN or infinite number in a parsed JSON document, with its field's path
    (``rope_scaling.factor``, ``layer_types[3]``), or None. No field of a model config may be
    one, read or not."""
    if isinstance(node, float) and not math.isfinite(node):
        return at or "(the document)", node
    items = node.items() if isinstance(node, dict) else \
        enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        got = _non_finite(v, f"{at}[{k}]" if isinstance(k, int) else
                          f"{at}.{k}" if at else str(k))
        if got is not None:
            return got
    return None


def _modelled_type(cfg: Any, path: str) -> str:
    """The architecture a config is read as: its model_type where that is one modelled
    (``SUPPORTED_MODEL_TYPES``), else the one its ``architectures`` class runs as
    (``ARCHITECTURE_CLASSES``); a ``SpecError`` naming both where neither is."""
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected a JSON object")
    mt = cfg.get("model_type")
    if mt in SUPPORTED_MODEL_TYPES:
        return mt
    archs = cfg.get("architectures")
    if isinstance(archs, list) and len(archs) == 1 and isinstance(archs[0], str) and \
            archs[0] in ARCHITECTURE_CLASSES:
        return ARCHITECTURE_CLASSES[archs[0]]
    text = cfg.get("text_config")
    if isinstance(text, dict) and not isinstance(text.get("text_config"), dict):
        try:  # a vision-language wrapper around a language model modelled here
            _modelled_type(text, path)
            return TEXT_WRAPPER
        except SpecError:
            pass
    named = f" (architectures {archs[0]!r:.60})" if isinstance(archs, list) and archs else ""
    raise SpecError(f"{path}: model_type: {mt!r:.60}{named} is not supported; supported: "
                    f"{', '.join(SUPPORTED_MODEL_TYPES)}, a config whose architectures "
                    "names one of their model classes, or a multimodal one whose "
                    "text_config is one of those")


def _model_from_hf_config(cfg: dict, path: str) -> ModelSpec:
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected a JSON object")
    mt = cfg.get("model_type")
    uncounted, vision = False, None
    if mt == "gemma3" and isinstance(cfg.get("text_config"), dict):
        # the multimodal checkpoint: its language model is the text config, its SigLIP vision
        # encoder and projector counted where ``_siglip_vision`` can (else not counted:
        # ``vision_uncounted``); the name stays the checkpoint's
        text = {**GEMMA3_TEXT_DEFAULTS, **cfg["text_config"]}
        if "vision_config" in cfg:
            vision = _siglip_vision(cfg["vision_config"], text.get("hidden_size"), path)
        cfg = _unwrapped(cfg, text, model_type="gemma3_text")
    mt = _modelled_type(cfg, path)
    wrapper = None
    if mt in QWEN3_VL_TEXT:
        # the vision-language checkpoint: its language model is Qwen3's, in text_config; its
        # vision encoder's weights are counted (``_qwen3_vl_vision``), its work is not (the
        # requests modelled are text)
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise SpecError(f"{path}: text_config: expected the language model's fields")
        vision = _qwen3_vl_vision(cfg.get("vision_config"), path)
        wrapper, mt = mt, QWEN3_VL_TEXT[mt]
        cfg = _unwrapped(cfg, text, model_type=mt)
    if mt == TEXT_WRAPPER:
        # its language model alone, the vision encoder (vision_config) not counted; the name
        # stays the checkpoint's. Llama-4 keeps its wrapper's type, llama4: the engines'
        # rules name the multimodal class it is always served as (SGLang's MoE runner rule,
        # engines_db/sglang.yaml)
        if cfg.get("model_type") == "llama4":
            wrapper = "llama4"
        text = cfg["text_config"]
        # every encoder the wrapper configures beside its language model (vision_config,
        # audio_config, ...) is left out, and said so
        uncounted = any(k.endswith("_config") and isinstance(v, dict) and
                        k not in ("text_config", "quantization_config")
                        for k, v in cfg.items())
        cfg = _unwrapped(cfg, text)
        mt = _modelled_type(cfg, path)
    # a snapshot's config.json is named by its folder; any other file by its own name
    stem = Path(path).stem
    name = cfg.get("_name_or_path") or (Path(path).parent.name if stem == "config" else stem)
    name = str(name).rstrip("/").split("/")[-1] or "config"
    d: dict[str, Any] = {"name": name, "architecture": mt, "source": path}
    if mt == "gpt2":
        h = _req(cfg, "n_embd", path)
        d.update(vocab_size=_req(cfg, "vocab_size", path), hidden_size=h,
                 num_layers=_req(cfg, "n_layer", path),
                 num_attention_heads=_req(cfg, "n_head", path),
                 num_kv_heads=_req(cfg, "n_head", path),
                 intermediate_size=_opt_int(cfg, "n_inner", path, 4 * h),
                 max_position_embeddings=_req(cfg, "n_positions", path),
                 tie_word_embeddings=_opt_bool(cfg, "tie_word_embeddings", path, True),
                 mlp="plain", norm="layernorm", position_embedding="learned",
                 attention_bias=True, attention_out_bias=True, mlp_bias=True)
        return validate(ModelSpec, d, path, names=_GPT2_KEYS)

    for key in _HF_SIZES:  # a size must be a whole number: 1e30 had failed deep inside
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise SpecError(f"{path}: {key}: expected a whole number, got {v!r:.40}")
    heads = _req(cfg, "num_attention_heads", path)
    d.update(vocab_size=_req(cfg, "vocab_size", path),
             hidden_size=_req(cfg, "hidden_size", path),
             num_layers=_req(cfg, "num_hidden_layers", path),
             num_attention_heads=heads,
             num_kv_heads=_opt_int(cfg, "num_key_value_heads", path, heads),
             intermediate_size=_req(cfg, "intermediate_size", path),
             max_position_embeddings=_req(cfg, "max_position_embeddings", path),
             tie_word_embeddings=_opt_bool(cfg, "tie_word_embeddings", path,
                                           mt in ("gemma", "gemma2")))
    if _opt_int(cfg, "head_dim", path, None) is not None:
        d["head_dim"] = cfg["head_dim"]
    if mt == "qwen2":
        d["attention_bias"] = True  # Qwen2 always carries q, k, v biases
    elif _opt_bool(cfg, "attention_bias", path, False):
        # Llama's and gpt-oss's flag covers o_proj too; Qwen3's, GLM-4.5's and MiniMax-M2's
        # only q, k, v
        d["attention_bias"] = True
        d["attention_out_bias"] = mt not in ("qwen3", "qwen3_moe", "glm4_moe", "minimax_m2")
    if _opt_bool(cfg, "mlp_bias", path, False):
        d["mlp_bias"] = True
    if mt in ("gemma2", "gemma3_text"):
        d["norms_per_layer"] = 4
    if mt in ("qwen3", "qwen3_moe", "gemma3_text") or (
            mt == "glm4_moe" and _opt_bool(cfg, "use_qk_norm", path, False)):
        d["qk_norm"] = True  # GLM-4.5's, where use_qk_norm: each head's, as Qwen3's
    d.update(_sliding_window(cfg, mt, d["num_layers"], path))
    if mt == "mixtral":
        d["moe"] = {"num_experts": _req(cfg, "num_local_experts", path),
                    "experts_per_token": _req(cfg, "num_experts_per_tok", path),
                    "expert_intermediate_size": d["intermediate_size"]}
    if mt == "gpt_oss":
        # every layer MoE with biased experts and router, attention sinks
        d["attention_sinks"] = True
        k = cfg.get("num_experts_per_tok", cfg.get("experts_per_token"))
        if k is None:
            raise SpecError(f"{path}: num_experts_per_tok: missing required field for "
                            "model_type gpt_oss")
        if "experts_per_token" in cfg and cfg["experts_per_token"] != k:
            # the official config states both; they must agree
            raise SpecError(f"{path}: experts_per_token ({cfg['experts_per_token']!r:.20}) "
                            f"differs from num_experts_per_tok ({k!r:.20})")
        d["moe"] = {"num_experts": _req(cfg, "num_local_experts", path),
                    "experts_per_token": k, "expert_intermediate_size": d["intermediate_size"],
                    "router_bias": True, "expert_bias": True}
    if mt == "qwen3_moe":
        layers = d["num_layers"]
        sparse = [i for i in range(layers) if _qwen_moe_layer(cfg, i, path)]
        first, step = _moe_layout(sparse, layers, cfg.get("decoder_sparse_step", 1))
        if first is None:
            raise SpecError(f"{path}: decoder_sparse_step / mlp_only_layers: MoE layers "
                            "other than every step-th after the first dense ones are not "
                            "modelled")
        d["moe"] = {"num_experts": _req(cfg, "num_experts", path),
                    "experts_per_token": _req(cfg, "num_experts_per_tok", path),
                    "expert_intermediate_size": _req(cfg, "moe_intermediate_size", path),
                    "first_dense_layers": first, "layer_step": step}
    if mt in MLA_TYPES:
        d["mla"] = {"q_lora_rank": cfg.get("q_lora_rank"),
                    "kv_lora_rank": _req(cfg, "kv_lora_rank", path),
                    "qk_nope_head_dim": _req(cfg, "qk_nope_head_dim", path),
                    "qk_rope_head_dim": _req(cfg, "qk_rope_head_dim", path),
                    "v_head_dim": _req(cfg, "v_head_dim", path)}
        if mt in SPARSE_MLA_TYPES:
            # DeepSeek Sparse Attention (DeepSeek-V3.2; GLM-5's GlmMoeDsaForCausalLM, which
            # vLLM runs as its DeepseekV2ForCausalLM): the lightning indexer's heads and
            # head size, and the tokens each query attends to
            for k in INDEXER_FIELDS:
                d["mla"][k] = _req(cfg, k, path)
        d["head_dim"] = d["mla"]["qk_nope_head_dim"] + d["mla"]["qk_rope_head_dim"]
        if _opt_int(cfg, "moe_layer_freq", path, 1) != 1:
            raise SpecError(f"{path}: moe_layer_freq: a MoE layer every "
                            f"{cfg['moe_layer_freq']!r:.20} layers is not modelled (1 is)")
        if _opt_int(cfg, "n_routed_experts", path, 0, least=0):
            d["moe"] = _deepseek_moe(cfg, path, cfg.get("topk_method") == "noaux_tc")
    if mt == "glm4_moe":
        # GLM-4.5 / 4.6 / 4.7 (transformers' Glm4MoeForCausalLM, vLLM's glm4_moe.py): the
        # DeepSeek-V3 mixture of experts, with a per-expert correction bias in every gate,
        # on GQA attention with q, k, v biases; partial_rotary_factor (RoPE over part of a
        # head) is elementwise work not priced apart
        d["moe"] = _deepseek_moe(cfg, path, True)
    if mt in (*MLA_TYPES, "glm4_moe"):
        # the multi-token-prediction layers it ships (DeepSeek-V3 and R1: 1; Kimi-K2: 0)
        d["mtp_layers"] = _opt_int(cfg, "num_nextn_predict_layers", path, None, least=0)
    if mt == "minimax_m2":
        d.update(_minimax_m2(cfg, path))
    if mt == "llama4_text":
        d.update(_llama4_text(cfg, d["num_layers"], path))
    if wrapper is not None:  # Qwen3-VL, Llama-4: named as the checkpoint's class
        d["architecture"] = wrapper
    if vision is not None:  # its vision encoder counted
        d.update(vision_params=vision[0], vision_replicated_params=vision[1])
    if uncounted:
        d["vision_uncounted"] = True
    experts = {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts",
               "minimax_m2": "num_local_experts", "llama4_text": "num_local_experts",
               "qwen3_moe": "num_experts"}.get(mt, "n_routed_experts")
    return validate(ModelSpec, d, path, names={
        **_HF_KEYS, "moe.num_experts": experts,
        "moe.expert_intermediate_size": "intermediate_size"
        if mt in ("mixtral", "gpt_oss", "minimax_m2", "llama4_text")
        else "moe_intermediate_size",
        **({"intermediate_size": "intermediate_size_mlp"} if mt == "llama4_text" else {})})


def _deepseek_moe(cfg: dict, path: str, router_bias: bool) -> dict[str, Any]:
    """DeepSeek-V3's mixture of experts as its config.json states it (GLM-4.5's alike): the
    first first_k_dense_replace layers dense, then n_routed_experts routed experts of
    moe_intermediate_size, num_experts_per_tok a token, beside n_shared_experts shared ones;
    ``router_bias``: each gate's per-expert correction bias."""
    return {"num_experts": _req(cfg, "n_routed_experts", path),
            "experts_per_token": _req(cfg, "num_experts_per_tok", path),
            "expert_intermediate_size": _req(cfg, "moe_intermediate_size", path),
            "num_shared_experts": _opt_int(cfg, "n_shared_experts", path, 0, least=0),
            "first_dense_layers": _opt_int(cfg, "first_k_dense_replace", path, 0, least=0),
            "router_bias": router_bias}


def _unwrapped(cfg: dict, text: dict, **override: Any) -> dict:
    """A multimodal wrapper's language model as a config of its own: its ``text`` fields
    under the checkpoint's name, and the wrapper's tie_word_embeddings where it states one
    (vLLM copies the top level's into the text config under transformers 5 and later,
    vllm/config/vllm.py at 0.19.1), else the text's; ``override``: fields set outright."""
    top = cfg.get("tie_word_embeddings")
    return {"_name_or_path": cfg.get("_name_or_path"), **text, **override,
            "tie_word_embeddings": top if top is not None else text.get("tie_word_embeddings")}


def _vision_sizes(vc: Any, fields: dict[str, int | None], path: str) -> dict[str, int]:
    """A vision_config's sizes, each a whole number from 1 (``fields``: their defaults,
    None where the field is required)."""
    if not isinstance(vc, dict):
        raise SpecError(f"{path}: vision_config: expected the vision encoder's fields")
    out = {}
    for k, default in fields.items():
        x = vc.get(k, default)
        if isinstance(x, bool) or not isinstance(x, int) or x < 1 or x > 10**7:
            raise SpecError(f"{path}: vision_config.{k}: expected a whole number from 1, got "
                            f"{x!r:.40}")
        out[k] = x
    return out


def _siglip_vision(vc: Any, text_hidden: Any, path: str) -> tuple[int, int]:
    """(all, every-rank) weights of Gemma-3's vision encoder and projector from its
    ``vision_config``, as transformers' SiglipVisionModel (no pooling head) and
    Gemma3MultiModalProjector build them, and vLLM's siglip.py / gemma3_mm.py split them: a
    Conv2d patch embedding (num_channels x patch_size^2 x hidden, with a bias) and
    (image_size / patch_size)^2 learned positions; num_hidden_layers blocks of two
    LayerNorms (weight and bias), q, k, v and output projections with biases and an MLP of
    intermediate_size (two projections with biases); a final LayerNorm; then the projector,
    a hidden x text hidden matrix and an RMSNorm of hidden. The Gemma 3 report (arXiv
    2503.19786, table 1) counts the encoder at 417M (416,866,032 here). Held whole on every
    TP rank: the embeddings, the norms, the output projection's and the MLP's second bias,
    and the projector. No pooling head, whatever ``vision_use_head`` says: vLLM's
    gemma3_mm.py builds SiglipVisionModel without one."""
    v = _vision_sizes(vc, {"hidden_size": None, "intermediate_size": None,
                           "num_hidden_layers": None, "patch_size": None, "image_size": None,
                           "num_channels": 3}, path)
    if isinstance(text_hidden, bool) or not isinstance(text_hidden, int) or text_hidden < 1:
        raise SpecError(f"{path}: text_config.hidden_size: expected a whole number")
    h, i = v["hidden_size"], v["intermediate_size"]
    embed = v["num_channels"] * v["patch_size"] ** 2 * h + h + \
        (v["image_size"] // v["patch_size"]) ** 2 * h
    block_split = 3 * (h * h + h) + h * h + h * i + i + i * h
    block_whole = 4 * h + h + h  # two LayerNorms; the output projection's and fc2's biases
    whole = embed + v["num_hidden_layers"] * block_whole + 2 * h + h * text_hidden + h
    return whole + v["num_hidden_layers"] * block_split, whole


def _qwen3_vl_vision(vc: Any, path: str) -> tuple[int, int]:
    """(all, every-rank) weights of Qwen3-VL's vision encoder from its ``vision_config``, as
    transformers' Qwen3VLVisionModel and vLLM's qwen3_vl.py build it: a Conv3d patch embedding
    (in_channels x temporal_patch_size x patch_size^2 x hidden, with a bias); a learned
    position embedding of num_position_embeddings; depth blocks, each two LayerNorms (weight
    and bias), attention (a fused qkv with biases, an output projection with a bias) and an
    MLP of intermediate_size (two projections with biases); a patch merger (a LayerNorm over
    hidden, then hidden x m^2 -> hidden x m^2 -> out_hidden_size, m the spatial_merge_size,
    both with biases), and one more merger per deepstack_visual_indexes entry whose LayerNorm
    is over hidden x m^2. Held whole on every TP rank: the embeddings, the norms and the
    row-parallel layers' biases (the output projection's, the MLP's second and each merger's
    second)."""
    v = _vision_sizes(vc, dict.fromkeys((
        "hidden_size", "intermediate_size", "depth", "patch_size", "temporal_patch_size",
        "in_channels", "num_position_embeddings", "out_hidden_size", "spatial_merge_size")),
        path)
    deep = vc.get("deepstack_visual_indexes") or []
    if not isinstance(deep, list) or len(deep) > v["depth"]:
        raise SpecError(f"{path}: vision_config.deepstack_visual_indexes: expected a list of "
                        "block indices")
    h, i, out = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    merged = h * v["spatial_merge_size"] ** 2
    embed = (v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2 * h + h
             + v["num_position_embeddings"] * h)
    block_split = 3 * h * h + 3 * h + h * h + h * i + i + i * h
    block_whole = 4 * h + h + h  # two LayerNorms; the output projection's and fc2's biases
    merger_split = merged * merged + merged + merged * out
    mergers_whole = (2 * h + out) + len(deep) * (2 * merged + out)
    whole = embed + v["depth"] * block_whole + mergers_whole
    return whole + v["depth"] * block_split + (1 + len(deep)) * merger_split, whole


def _llama4_text(cfg: dict, layers: int, path: str) -> dict[str, Any]:
    """Llama-4's language model (``llama4_text``, in Llama4ForConditionalGeneration's
    text_config), as vLLM 0.19.1's llama4.py builds it: MoE layers every
    ``interleave_moe_layer_step``-th layer ((i + 1) % step == 0: Scout every layer, Maverick
    every second), each ``num_local_experts`` routed experts of width ``intermediate_size``
    (``num_experts_per_tok`` a token, a router without bias) beside one shared expert of that
    width; the other layers a dense MLP of ``intermediate_size_mlp``. Attention has no bias,
    whatever ``attention_bias`` says (vLLM builds it without);
    its q/k norm is a parameter-free L2 norm (elementwise work not priced apart). The layers
    with RoPE (``no_rope_layers`` 1; by default, or where it is empty, all but every
    ``no_rope_layer_interval``-th, 4) attend within chunks of
    ``attention_chunk_size`` tokens, the others (NoPE) over everything: the chunked layers
    are priced as a sliding window of the chunk's length, exact within the first chunk and an
    upper bound beyond it (a chunk's tokens attend to the chunk so far, not the last chunk's
    worth), their KV cache likewise at most one chunk."""
    dense = _req(cfg, "intermediate_size_mlp", path)
    step = _opt_int(cfg, "interleave_moe_layer_step", path, 1)
    out: dict[str, Any] = {
        "intermediate_size": dense, "attention_bias": False, "attention_out_bias": False,
        "moe": {"num_experts": _req(cfg, "num_local_experts", path),
                "experts_per_token": _req(cfg, "num_experts_per_tok", path),
                "expert_intermediate_size": _req(cfg, "intermediate_size", path),
                "num_shared_experts": 1, "layer_step": step}}
    chunk = _opt_int(cfg, "attention_chunk_size", path, None)
    if chunk is not None:
        rope = cfg.get("no_rope_layers")
        if not rope:  # transformers' Llama4TextConfig default (an empty list too)
            every = _opt_int(cfg, "no_rope_layer_interval", path, 4)
            rope = [int((i + 1) % every != 0) for i in range(layers)]
        if not isinstance(rope, list) or len(rope) != layers or any(
                r not in (0, 1) or isinstance(r, bool) for r in rope):
            raise SpecError(f"{path}: no_rope_layers: expected {layers} entries, each 0 or 1")
        kinds = ["sliding" if r else "full" for r in rope]
        if "sliding" in kinds:
            pattern = _period(kinds)
            out["sliding_window"] = chunk
            if pattern != ("sliding",):
                out["sliding_window_pattern"] = list(pattern)
    return out


def _minimax_m2(cfg: dict, path: str) -> dict[str, Any]:
    """MiniMax-M2's fields beyond the common ones, as vLLM 0.19.1's MiniMaxM2ForCausalLM
    builds the model (vllm/model_executor/models/minimax_m2.py): every layer a mixture of
    ``num_local_experts`` experts of width ``intermediate_size``, ``num_experts_per_tok`` a
    token, routed by sigmoid scores with a per-expert bias (``use_routing_bias``); full
    attention (no window passed) with q, k, v biases where ``attention_bias`` (none on
    o_proj), and an RMSNorm over the whole q and the whole k of every layer, split over the
    TP ranks (MiniMaxText01RMSNormTP), whatever ``use_qk_norm`` and ``qk_norm_type`` say: vLLM
    reads neither. Its multi-token-prediction modules (``use_mtp``) are loaded only as a
    speculative drafter, so not counted; rotary_dim (RoPE over part of a head) is elementwise
    work the model does not price apart."""
    if _opt_int(cfg, "shared_intermediate_size", path, 0, least=0):
        raise SpecError(f"{path}: shared_intermediate_size: a shared expert is not modelled "
                        "for model_type minimax_m2")
    kinds = cfg.get("attn_type_list")  # MiniMax's per-layer attention: 1 softmax, 0 linear
    if kinds is not None and (not isinstance(kinds, list) or any(k != 1 for k in kinds)):
        raise SpecError(f"{path}: attn_type_list: only softmax-attention layers (1) are "
                        "modelled, not linear attention")
    out: dict[str, Any] = {"moe": {
        "num_experts": _req(cfg, "num_local_experts", path),
        "experts_per_token": _req(cfg, "num_experts_per_tok", path),
        "expert_intermediate_size": _req(cfg, "intermediate_size", path),
        "router_bias": _opt_bool(cfg, "use_routing_bias", path, False)},
        "qk_norm": True, "qk_norm_scope": "layer"}
    return out


_HF_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "intermediate_size", "max_position_embeddings",
             "num_local_experts", "num_experts", "num_experts_per_tok",
             "moe_intermediate_size", "n_routed_experts", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim", *INDEXER_FIELDS)

# a config.json's keys for ModelSpec's fields, so that an error names what the file says
_HF_KEYS = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads",
            "moe.experts_per_token": "num_experts_per_tok",
            "moe.num_shared_experts": "n_shared_experts",
            "moe.first_dense_layers": "first_k_dense_replace",
            **{f"mla.{k}": k for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                       "qk_rope_head_dim", "v_head_dim", *INDEXER_FIELDS)}}
_GPT2_KEYS = {"hidden_size": "n_embd", "num_layers": "n_layer", "num_attention_heads": "n_head",
              "num_kv_heads": "n_head", "max_position_embeddings": "n_positions",
              "intermediate_size": "n_inner"}


# the names a config.json's torch_dtype / dtype takes (torch's dtype names as transformers
# writes them); any other is refused rather than read as none given
TORCH_DTYPES = ("bfloat16", "float16", "float32", "float64", "float", "half", "double", "auto",
                "float8_e4m3fn", "float8_e5m2", "int8", "uint8")


BANDS_FILE = _HERE / "data" / "bands.yaml"


def load_bands(path: Path | None = None) -> list:
    """The error bands (``planner.evidence.bands``) that estimate, simulate and plan put
    around their figures: planner/data/bands.yaml, written by ``llmplan validate
    --write-bands``."""
    from planner.evidence.bands import from_table

    p = Path(path) if path else BANDS_FILE
    data = read_yaml(p)
    if not isinstance(data, dict) or not isinstance(data.get("bands"), list):
        raise SpecError(f"{p}: expected a mapping with a 'bands' list")
    try:
        return from_table(data["bands"], str(p))
    except ValueError as e:
        raise SpecError(str(e)) from None


def write_bands(path: Path, bands: list, *, sources: list[str]) -> None:
    from planner.evidence.bands import HIGH_Q, LOW_Q, MIN_FIGURES, MIN_SOURCES, to_table

    head = ("# Error bands: the 10th and 90th percentiles of measured / predicted over the\n"
            "# held-out figures of `llmplan validate` (static rows and served runs; times as\n"
            "# measured / predicted, static rates as predicted / measured), by engine, phase\n"
            "# and regime, with fallbacks to every regime and every engine (engine or regime\n"
            "# 'all'), each with the GPU classes (architectures) its figures were measured\n"
            "# on. Written by `llmplan validate --write-bands planner/data/bands.yaml`;\n"
            "# tests/test_validate.py checks it matches a fresh validate. Do not edit by hand.\n")
    body = {"quantiles": [LOW_Q, HIGH_Q], "min_figures": MIN_FIGURES,
            "min_sources": MIN_SOURCES, "sources": sources, "bands": to_table(bands)}
    Path(path).write_text(head + yaml.safe_dump(body, sort_keys=False, width=100))


SPECULATION_FILE = _HERE / "data" / "speculation.yaml"


class _Acceptance(BaseModel):
    model_config = {"extra": "forbid"}
    method: str
    k: int = Field(ge=1, le=64)
    length: float | None = Field(default=None, ge=1)
    rate: float | None = Field(default=None, ge=0, le=1)
    source: str
    retrieved: str
    estimated: bool
    models: list[str] = []
    architectures: list[str] = []
    drafts: list[str] = []
    note: str = ""


def load_acceptance(path: Path | None = None) -> tuple:
    """Published acceptance of speculative decoding by method and model family
    (planner/data/speculation.yaml) as ``planner.layouts.speculation.PublishedAcceptance``."""
    from planner.layouts.speculation import METHODS, PublishedAcceptance, acceptance_for_length

    p = Path(path) if path else SPECULATION_FILE
    data = read_yaml(p)
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise SpecError(f"{p}: expected a mapping with an 'entries' list")
    out = []
    for i, raw in enumerate(data["entries"]):
        e = validate(_Acceptance, raw, f"{p}: entries.{i}")
        where = f"{p}: entries.{i}"
        if e.method not in METHODS:
            raise SpecError(f"{where}: method '{e.method}' is not one of {', '.join(METHODS)}")
        if (e.length is None) == (e.rate is None):
            raise SpecError(f"{where}: give exactly one of length and rate")
        if e.length is not None and e.length > e.k + 1:
            raise SpecError(f"{where}: length {e.length:g} is more than k + 1 = {e.k + 1}")
        if not (e.models or e.architectures):
            raise SpecError(f"{where}: name the models or architectures it covers")
        entry = PublishedAcceptance(
            method=e.method, source=" ".join(e.source.split()), retrieved=e.retrieved, k=e.k,
            length=e.length, rate=e.rate, estimated=e.estimated,
            models=tuple(x.lower() for x in e.models), architectures=tuple(e.architectures),
            drafts=tuple(x.lower() for x in e.drafts), note=" ".join(e.note.split()))
        if e.length is not None:
            acceptance_for_length(e.length, e.k)
        out.append(entry)
    return tuple(out)


LENGTHS_DIR = _HERE / "data" / "lengths"


def length_names() -> list[str]:
    return sorted(p.stem for p in LENGTHS_DIR.glob("*.yaml"))


def load_lengths(name: str) -> list[tuple[int, int]]:
    """A published (prompt, output) length distribution by name (planner/data/lengths)."""
    path = LENGTHS_DIR / f"{name}.yaml"
    if name not in length_names():
        raise SpecError(f"unknown length distribution '{name}'; known: "
                        f"{', '.join(length_names())}")
    data = read_yaml(path)
    try:
        pairs = [(int(p), int(o)) for p, o in data["pairs"]]
    except (KeyError, TypeError, ValueError):
        raise SpecError(f"{path}: pairs: expected a list of [prompt, output] integers") from None
    if not pairs or min(min(p) for p in pairs) < 1:
        raise SpecError(f"{path}: pairs: need at least one pair of positive lengths")
    return pairs


PRICES_DIR = _HERE / "data" / "prices"
DEFAULT_PRICES = "hyperscaler-on-demand"  # the basis a cost is on unless --prices says


def price_set_names() -> list[str]:
    return sorted(p.stem for p in PRICES_DIR.glob("*.yaml"))


def default_prices() -> str:
    """The price set costs are on unless --prices says: $LLMPLAN_PRICES (a set's name or a
    file: a team's own owned-GPU costs, say), else ``DEFAULT_PRICES``."""
    return os.environ.get("LLMPLAN_PRICES") or DEFAULT_PRICES


def price_set(ref: str | None = None):
    """``load_price_set``, read once per set and process (every GPU loaded is priced)."""
    key = default_prices() if ref is None else ref
    if key not in _PRICE_SETS:
        _PRICE_SETS[key] = load_price_set(key)
    return _PRICE_SETS[key]


_PRICE_SETS: dict = {}


def price_reason(gpu: str, prices: str | None = None) -> str:
    """Why ``gpu`` has no price in the set ``prices`` (None: the default)."""
    return price_set(prices).not_sold(gpu)


def load_price_set(ref: str | None = None):
    """A named price set (planner/data/prices: ``price_set_names()``) or a YAML file of the
    same schema (``planner.core.prices.PriceSet``); None: ``DEFAULT_PRICES``."""
    from planner.core.prices import PriceSet

    ref = default_prices() if ref is None else ref
    if not ref.strip():
        raise SpecError("--prices: no price set given")
    p = Path(ref)
    if p.suffix in (".yaml", ".yml"):
        if not is_file(p, "price set file"):
            raise SpecError(f"{ref}: no such file")
        path = p
    elif ref.casefold() in {n.casefold() for n in price_set_names()}:
        path = PRICES_DIR / f"{ref.casefold()}.yaml"
    else:
        close = difflib.get_close_matches(ref, price_set_names(), n=3, cutoff=0.5)
        raise SpecError(f"--prices: unknown price set '{ref}'"
                        + (f"; did you mean {', '.join(close)}?" if close else "")
                        + f" (known: {', '.join(price_set_names())}, or a YAML file)")
    return validate(PriceSet, read_yaml(path), str(path))


def parse_price_overrides(items: list[str] | None) -> dict[str, float]:
    """``--price GPU=USD_PER_HOUR`` (repeatable, or comma-separated): {gpu: USD per GPU-hour}."""
    out: dict[str, float] = {}
    for item in items or ():
        for part in item.split(","):
            name, sep, value = part.partition("=")
            name = name.strip()
            try:
                usd = float(value) if sep else math.nan
            except ValueError:
                usd = math.nan
            # a tenth of a cent an hour at least: below it every cost prints as $0.000
            if not name or not (math.isfinite(usd) and 0.001 <= usd <= 10_000):
                raise SpecError(f"--price: expected GPU=USD_PER_HOUR with 0.001 <= USD <= "
                                f"10,000, got {part.strip()[:60]!r}"
                                + ("..." if len(part.strip()) > 60 else ""))
            out[name] = usd
    return out


def check_price_names(overrides: dict[str, float], gpus: list[str]) -> None:
    """Every GPU a --price names is one the command costs."""
    for name in overrides:
        if name not in gpus:
            raise SpecError(f"--price: '{name}' is not a GPU this command costs "
                            f"({', '.join(gpus) if len(gpus) <= 6 else 'see llmplan gpus'})")


def priced(hw: HardwareSpec, prices, overrides: dict[str, float] | None = None,
           every_gpu: float | None = None) -> tuple[HardwareSpec, str | None]:
    """``hw`` with its price from, in order: ``every_gpu`` (--price-per-hour),
    ``overrides`` (--price GPU=USD), the price set ``prices``, or, for a GPU the set does not
    list at all (a user's own GPU file), the file's own ``price``. Returns the priced spec and,
    where it has no price, why."""
    from planner.core.specs import Price

    if every_gpu is not None:
        return hw.model_copy(update={"price": Price(usd_per_gpu_hour=every_gpu,
                                                    source="--price-per-hour",
                                                    date="command line")}), None
    if overrides and hw.name in overrides:
        return hw.model_copy(update={"price": Price(
            usd_per_gpu_hour=overrides[hw.name], source=f"--price {hw.name}="
            f"{overrides[hw.name]:g}", date="command line")}), None
    if prices.entry(hw.name) is None and hw.price is not None:
        return hw, None  # a GPU the set does not know keeps its own file's price
    p = prices.price(hw.name)
    if p is None:
        why = f"not sold in price set {prices.name}: {prices.not_sold(hw.name)}"
        return hw.model_copy(update={"price": None, "price_missing": why}), why
    return hw.model_copy(update={"price": p, "price_missing": None}), None
