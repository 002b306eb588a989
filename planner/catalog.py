"""Find and load specs: the built-in databases, YAML files of the same schema, and Hugging Face
``config.json`` files. Every problem becomes a ``SpecError`` whose one-line message names the
file, the field and what is wrong.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner.engine import Engine, EngineSpec
from planner.errors import SpecError
from planner.specs import Calibration, HardwareSpec, ModelSpec

_HERE = Path(__file__).resolve().parent
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


def _format_validation(path: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:3]:
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (misspelled?)"
        elif e["type"] == "missing":
            msg = "missing required field"
        parts.append(f"{loc}: {msg}")
    more = f" (+{len(err.errors()) - 3} more)" if len(err.errors()) > 3 else ""
    return f"{path}: " + "; ".join(parts) + more


def validate(cls: type[S], data: Any, path: str) -> S:
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise SpecError(_format_validation(path, err)) from None


def read_text(path: Path) -> str:
    """A file's UTF-8 text, or a ``SpecError`` naming the file and what is wrong."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise SpecError(f"{path}: not UTF-8 text (byte {err.start}: "
                        f"{err.object[err.start:err.start + 1]!r})") from None


def read_json(path: Path) -> Any:
    """A JSON document: malformed, too deep or with a number too long is one line."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"{path}: line {err.lineno}: malformed JSON: {err.msg}") from None
    except RecursionError:
        raise SpecError(f"{path}: JSON nested too deeply") from None
    except ValueError as err:  # an integer of thousands of digits
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


def read_yaml(path: Path) -> Any:
    text = read_text(path)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where the wheel has it
    try:
        if "*" in text:  # size the graph, aliases expanded, before building anything
            n = _expanded_nodes(yaml.compose(text, Loader=loader), {})
            if n > MAX_YAML_NODES:
                raise SpecError(f"{path}: its YAML aliases expand to {n:,} nodes "
                                f"(at most {MAX_YAML_NODES:,})")
        return yaml.load(text, Loader=loader)
    except RecursionError:
        raise SpecError(f"{path}: YAML nested too deeply") from None
    except ValueError as err:  # a scalar YAML resolves but Python cannot build (5000 digits)
        raise SpecError(f"{path}: unreadable value: {str(err).split(';')[0]}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(f"{path}:{where}: malformed YAML: {problem}") from None


def is_file(p: Path, what: str) -> bool:
    """Whether ``p`` is a file; a path the OS refuses to look up (a name too long, a NUL
    byte) is a ``SpecError`` naming ``what`` it was meant to be."""
    try:
        return p.is_file()
    except (OSError, ValueError) as err:
        ref = str(p)
        raise SpecError(f"{ref[:80]}{'...' if len(ref) > 80 else ''}: not a usable "
                        f"{what} name or path ({getattr(err, 'strerror', None) or err})") from None


def _resolve(ref: str, kind: str, what: str) -> Path:
    if not ref.strip():
        raise SpecError(f"no {what} given")
    p = Path(ref)
    is_file_ = is_file(p, what)
    if p.suffix in (".yaml", ".yml", ".json") or is_file_:
        if not is_file_:
            raise SpecError(f"{ref}: no such file")
        return p
    known = _names(kind)
    if ref in known:
        return db_dir(kind) / f"{ref}.yaml"
    close = difflib.get_close_matches(ref, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise SpecError(f"unknown {what} '{ref}' (not a file, not in {kind}/){hint} "
                    f"Known: {', '.join(known)}")


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
        return model_from_hf_config(read_json(cfg), str(cfg))
    path = _resolve(ref, "models_db", "model")
    if path.suffix == ".json":
        return model_from_hf_config(read_json(path), str(path))
    data = read_yaml(path)
    return validate(ModelSpec, data, str(path))


def load_hardware(ref: str) -> HardwareSpec:
    path = _resolve(ref, "hardware_db", "GPU")
    return validate(HardwareSpec, read_yaml(path), str(path))


def load_engine_spec(ref: str) -> EngineSpec:
    """A built-in engine profile name (engines_db/) or a YAML file of the same schema."""
    path = _resolve(ref, "engines_db", "engine")
    return validate(EngineSpec, read_yaml(path), str(path))


def load_engine(ref: str) -> Engine:
    return load_engine_spec(ref).model()


VALIDATION_DIR = _HERE / "data" / "validation"


def load_datasets(paths: list[Path] | None = None) -> list:
    """The built-in validation datasets (planner/data/validation/*.yaml), or ``paths``."""
    from planner.validate import Dataset

    files = paths if paths else sorted(VALIDATION_DIR.glob("*.yaml"))
    out = []
    for f in files:
        p = Path(f)
        if not p.is_file():
            raise SpecError(f"{p}: no such dataset file")
        out.append(validate(Dataset, read_yaml(p), str(p)))
    ids = [d.source.id for d in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise SpecError(f"validation datasets: source id {', '.join(dup)} appears twice")
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
    from planner.budget import Budget

    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such budget file")
    data = read_yaml(p)
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
    if not is_file(p, "calibration"):
        raise SpecError(f"{p}: no such calibration file")
    data = read_json(p) if p.suffix == ".json" else read_yaml(p)
    return validate(Calibration, data, str(p))


# --------------------------------------------------------------------------- HF config.json

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2", "phi3",
                         "gpt2", "deepseek_v2", "deepseek_v3")


def _req(cfg: dict, key: str, path: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise SpecError(f"{path}: {key}: missing required field for "
                        f"model_type {cfg.get('model_type')}")
    return cfg[key]


def model_from_hf_config(cfg: dict, path: str) -> ModelSpec:
    """Translate the fields of an official HF config into a ``ModelSpec``."""
    try:
        return _model_from_hf_config(cfg, path)
    except (TypeError, OverflowError) as err:  # a list or a string where a size belongs
        raise SpecError(f"{path}: a size field is not a number ({err})") from None


def _model_from_hf_config(cfg: dict, path: str) -> ModelSpec:
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected a JSON object")
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise SpecError(f"{path}: model_type: '{mt}' is not supported; supported: "
                        f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    name = (cfg.get("_name_or_path") or Path(path).parent.name or Path(path).stem)
    name = str(name).rstrip("/").split("/")[-1] or "config"
    d: dict[str, Any] = {"name": name, "architecture": mt, "source": path}
    if mt == "gpt2":
        h = _req(cfg, "n_embd", path)
        d.update(vocab_size=_req(cfg, "vocab_size", path), hidden_size=h,
                 num_layers=_req(cfg, "n_layer", path),
                 num_attention_heads=_req(cfg, "n_head", path),
                 num_kv_heads=_req(cfg, "n_head", path),
                 intermediate_size=cfg.get("n_inner") or 4 * h,
                 max_position_embeddings=_req(cfg, "n_positions", path),
                 tie_word_embeddings=cfg.get("tie_word_embeddings", True),
                 mlp="plain", norm="layernorm", position_embedding="learned",
                 attention_bias=True, attention_out_bias=True, mlp_bias=True)
        return validate(ModelSpec, d, path)

    heads = _req(cfg, "num_attention_heads", path)
    d.update(vocab_size=_req(cfg, "vocab_size", path),
             hidden_size=_req(cfg, "hidden_size", path),
             num_layers=_req(cfg, "num_hidden_layers", path),
             num_attention_heads=heads,
             num_kv_heads=cfg.get("num_key_value_heads") or heads,
             intermediate_size=_req(cfg, "intermediate_size", path),
             max_position_embeddings=_req(cfg, "max_position_embeddings", path),
             tie_word_embeddings=cfg.get("tie_word_embeddings", mt in ("gemma", "gemma2")))
    if cfg.get("head_dim"):
        d["head_dim"] = cfg["head_dim"]
    if mt == "qwen2":
        d["attention_bias"] = True  # Qwen2 always carries q, k, v biases
    elif cfg.get("attention_bias"):
        d["attention_bias"] = d["attention_out_bias"] = True  # Llama's flag covers o_proj too
    if cfg.get("mlp_bias"):
        d["mlp_bias"] = True
    if mt == "gemma2":
        d["norms_per_layer"] = 4
    if mt == "mixtral":
        d["moe"] = {"num_experts": _req(cfg, "num_local_experts", path),
                    "experts_per_token": _req(cfg, "num_experts_per_tok", path),
                    "expert_intermediate_size": d["intermediate_size"]}
    if mt in ("deepseek_v2", "deepseek_v3"):
        d["mla"] = {"q_lora_rank": cfg.get("q_lora_rank"),
                    "kv_lora_rank": _req(cfg, "kv_lora_rank", path),
                    "qk_nope_head_dim": _req(cfg, "qk_nope_head_dim", path),
                    "qk_rope_head_dim": _req(cfg, "qk_rope_head_dim", path),
                    "v_head_dim": _req(cfg, "v_head_dim", path)}
        d["head_dim"] = d["mla"]["qk_nope_head_dim"] + d["mla"]["qk_rope_head_dim"]
        if cfg.get("n_routed_experts"):
            d["moe"] = {"num_experts": cfg["n_routed_experts"],
                        "experts_per_token": _req(cfg, "num_experts_per_tok", path),
                        "expert_intermediate_size": _req(cfg, "moe_intermediate_size", path),
                        "num_shared_experts": cfg.get("n_shared_experts") or 0,
                        "first_dense_layers": cfg.get("first_k_dense_replace") or 0,
                        "router_bias": cfg.get("topk_method") == "noaux_tc"}
    return validate(ModelSpec, d, path)
