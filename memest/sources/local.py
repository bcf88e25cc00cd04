"""Model references that are local files: a directory, a config.json, or a Meta params.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from memest.errors import ConfigError


def read_local(path: Path) -> tuple[dict[str, Any], str]:
    """The HF-style config dict at ``path`` and the file it came from.

    ``path`` may be a directory holding ``config.json`` (preferred) or ``params.json``, or either
    file itself. A Meta-format ``params.json`` is converted with :func:`config_from_meta_params`.

    Raises:
        ConfigError: no config file there, or it is not valid JSON.
    """
    if path.is_dir():
        for candidate in ("config.json", "params.json"):
            if (path / candidate).is_file():
                path = path / candidate
                break
        else:
            raise ConfigError(f"{str(path)!r} holds neither config.json nor params.json; point memest at a model folder")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{str(path)!r} is not valid JSON (line {exc.lineno}: {exc.msg}); fix the file") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{str(path)!r} holds a JSON {type(raw).__name__}, not an object; pass a config.json")
    if path.name == "params.json" or ("dim" in raw and "n_layers" in raw and "model_type" not in raw):
        raw = config_from_meta_params(raw, str(path))
    return raw, str(path)


def config_from_meta_params(params: dict[str, Any], where: str) -> dict[str, Any]:
    """A LlamaConfig-style dict from Meta's ``params.json`` (the llama reference repo's format).

    The FFN width follows the reference ``FeedForward``: ``hidden = int(2 * 4 * dim / 3)``, scaled
    by ``ffn_dim_multiplier`` when given, rounded up to a multiple of ``multiple_of``
    (meta-llama/llama ``llama/model.py``; for Llama-2-7B: 11008, Llama-3-8B: 14336).

    Raises:
        ConfigError: a required key is missing, or ``vocab_size`` is -1 (set by the tokenizer).
    """
    try:
        dim, n_layers, n_heads = int(params["dim"]), int(params["n_layers"]), int(params["n_heads"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where!r} is a params.json without a valid 'dim', 'n_layers' or 'n_heads' ({exc})") from exc
    vocab = int(params.get("vocab_size", -1))
    if vocab <= 0:
        raise ConfigError(
            f"{where!r} has vocab_size {vocab} (taken from the tokenizer); add the real size, "
            "e.g. \"vocab_size\": 32000 for Llama 2"
        )
    multiple_of = int(params.get("multiple_of", 256))
    hidden = int(2 * 4 * dim / 3)
    if params.get("ffn_dim_multiplier") is not None:
        hidden = int(float(params["ffn_dim_multiplier"]) * hidden)
    intermediate = multiple_of * math.ceil(hidden / multiple_of)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": intermediate,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(params.get("n_kv_heads") or n_heads),
        "vocab_size": vocab,
        "rms_norm_eps": float(params.get("norm_eps", 1e-5)),
        "rope_theta": float(params.get("rope_theta", 10000.0)),
        "max_position_embeddings": int(params.get("max_seq_len", 4096)),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
