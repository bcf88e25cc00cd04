"""Model references that are local files: a directory, a config.json, or a Meta params.json."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from memest.errors import ConfigError

MAX_CONFIG_BYTES = 64 * 2**20
"""Largest config file memest reads (64 MiB): real config.json files are a few KB to a few MB (those
listing every label of a classifier); a bigger one is not a config, and reading it would stall."""

MAX_NESTING = 64
"""Deepest nesting of objects and lists a config may have (real ones nest 3-4 levels)."""


def read_local(path: Path) -> tuple[dict[str, Any], str]:
    """The HF-style config dict at ``path`` and the file it came from.

    ``path`` may be a directory holding ``config.json`` (preferred) or ``params.json``, or either
    file itself. A Meta-format ``params.json`` is converted with :func:`config_from_meta_params`.
    Only a regular file of at most :data:`MAX_CONFIG_BYTES` is opened (never a FIFO, a device or a
    directory, which would block or never end).

    Raises:
        ConfigError: no config file there, it is not a regular file, too big, not UTF-8 JSON text,
            or not a JSON object.
    """
    if path.is_dir():
        for candidate in ("config.json", "params.json"):
            if (path / candidate).is_symlink() or (path / candidate).exists():
                path = path / candidate
                break
        else:
            raise ConfigError(f"{str(path)!r} holds neither config.json nor params.json; point memest at a model folder")
    where = str(path)
    _check_regular(path)
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {where!r}: {exc.strerror or exc}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where!r} is larger than {MAX_CONFIG_BYTES // 2**20} MiB, too big for a config.json; "
                          "pass the model's config.json")
    raw = parse_config(data, where)
    if is_meta_params(raw, path.name):
        raw = config_from_meta_params(raw, where)
    return raw, where


def _check_regular(path: Path) -> None:
    """Refuse, before opening it, a config path that is not a regular file, saying what it is.

    Raises:
        ConfigError: a dangling symlink, a directory, a FIFO, a device or a socket.
    """
    where = str(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError as exc:
        if path.is_symlink():
            raise ConfigError(f"{where!r} is a dangling symlink (to {os.readlink(path)!r}, which does not exist); "
                              "fix the link or pass the real config.json") from exc
        raise ConfigError(f"no such file: {where!r}; pass an existing config.json") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {where!r}: {exc.strerror or exc}") from exc
    if stat.S_ISREG(mode):
        return
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise ConfigError(f"{where!r} is {kind}, not a config file; pass a config.json, a params.json or a model folder")


def parse_config(data: bytes, where: str) -> dict[str, Any]:
    """The JSON object in ``data`` (the bytes of a config file read from ``where``).

    Raises:
        ConfigError: binary or non-UTF-8 data, invalid JSON, nesting deeper than :data:`MAX_NESTING`,
            a number too long to convert, or JSON that is not an object.
    """
    if b"\x00" in data:
        raise ConfigError(f"{where!r} is a binary file, not a JSON config; pass the model's config.json "
                          "(a text file), not a weights file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where!r} is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); "
                          "a config.json is UTF-8 JSON: re-save it as UTF-8") from exc
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where!r} is not valid JSON (line {exc.lineno}: {exc.msg}); fix the file") from exc
    except RecursionError as exc:
        raise ConfigError(f"{where!r} nests lists or objects too deeply to be a config; fix the file") from exc
    except ValueError as exc:  # an integer of more than sys.get_int_max_str_digits() digits
        raise ConfigError(f"{where!r} holds a number too long to read ({str(exc).split(':')[0]}); fix the file") from exc
    return check_config_data(raw, where)


def check_config_data(raw: Any, where: str) -> dict[str, Any]:
    """``raw`` (parsed JSON, read from a file or given as data) when it can be a config: a JSON object
    nesting at most :data:`MAX_NESTING` levels.

    Raises:
        ConfigError: not an object, or nested too deeply.
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{where!r} holds a JSON {type(raw).__name__}, not an object; pass a config.json")
    if _depth(raw) > MAX_NESTING:
        raise ConfigError(f"{where!r} nests lists or objects more than {MAX_NESTING} levels deep; a config nests a "
                          "few: fix the file")
    return raw


def is_meta_params(raw: dict[str, Any], name: str) -> bool:
    """True when ``raw`` (read as ``name``) is a Meta ``params.json``, not an HF config."""
    return name == "params.json" or ("dim" in raw and "n_layers" in raw and "model_type" not in raw)


def _depth(value: Any) -> int:
    """Nesting depth of JSON data (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def config_from_meta_params(params: dict[str, Any], where: str) -> dict[str, Any]:
    """A LlamaConfig-style dict from Meta's ``params.json`` (the llama reference repo's format).

    The FFN width follows the reference ``FeedForward``: ``hidden = int(2 * 4 * dim / 3)``, scaled
    by ``ffn_dim_multiplier`` when given, rounded up to a multiple of ``multiple_of``
    (meta-llama/llama ``llama/model.py``; for Llama-2-7B: 11008, Llama-3-8B: 14336).

    Raises:
        ConfigError: a required key is missing or malformed (a fraction, a string, infinite, out of
            bounds), or ``vocab_size`` is -1 (set by the tokenizer).
    """
    from memest.sources.config import HFConfig

    p = HFConfig(params, name=where, source=where)
    for key in ("dim", "n_layers", "n_heads"):
        if not p.has(key):
            raise ConfigError(f"{where!r} is a params.json without {key!r}; add it (Meta's format: dim, n_layers, "
                              "n_heads, vocab_size)")
    dim, n_layers, n_heads = p.int("dim"), p.int("n_layers"), p.int("n_heads")
    vocab = params.get("vocab_size", -1)
    if vocab == -1:
        raise ConfigError(
            f"{where!r} has vocab_size -1 (taken from the tokenizer); add the real size, "
            "e.g. \"vocab_size\": 32000 for Llama 2"
        )
    vocab = p.int("vocab_size")
    multiple_of = p.int("multiple_of", default=256)
    hidden = int(2 * 4 * dim / 3)
    if params.get("ffn_dim_multiplier") is not None:
        multiplier = p.float("ffn_dim_multiplier")
        if multiplier <= 0:
            raise ConfigError(f"{where!r}: 'ffn_dim_multiplier' is {multiplier!r}; it must be positive")
        hidden = int(multiplier * hidden)
    intermediate = multiple_of * math.ceil(hidden / multiple_of)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": intermediate,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": p.int("n_kv_heads", default=None) or n_heads,
        "vocab_size": vocab,
        "rms_norm_eps": p.float("norm_eps", default=1e-5),
        "rope_theta": p.float("rope_theta", default=10000.0),
        "max_position_embeddings": p.int("max_seq_len", default=4096),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
