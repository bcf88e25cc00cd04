"""The offline catalog: config.json files of popular models packaged with memest.

Files live in ``memest/catalog/<org>/<name>/config.json``; ``memest/catalog/SOURCES.md`` says
where each came from and whether it is an exact copy of the Hub file or derived.

A reference resolves to a catalog entry when it matches, ignoring case:

- the Hub id (``meta-llama/Llama-2-7b-hf``) or the bare name when unique (``gpt2``);
- the id without the ``-hf`` suffix (``meta-llama/Llama-2-7b``: Meta's own-format repo of the same
  model) and, for Llama 3.x, with or without the ``Meta-`` prefix (``Meta-Llama-3.1-8B``);
- a variant in ``aliases.json`` (instruct / chat / deduped repos that share the architecture), with
  the differences it lists applied and a note saying so.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATALOG_DIR = Path(__file__).resolve().parent.parent / "catalog"


@dataclass(frozen=True, slots=True)
class CatalogHit:
    """A resolved catalog reference.

    Attributes:
        model_id: The canonical id of the model asked for (the variant's id for an alias).
        path: The config.json used.
        overrides: Fields that differ between the variant and the packaged config.
        note: Why a different entry's config is used, empty for a direct hit.
    """

    model_id: str
    path: Path
    overrides: dict[str, Any]
    note: str


@functools.cache
def entries() -> dict[str, Path]:
    """Catalog ids (``org/name``) mapped to their config.json, sorted by id."""
    found = {}
    for path in CATALOG_DIR.glob("*/*/config.json"):
        found[f"{path.parent.parent.name}/{path.parent.name}"] = path
    return dict(sorted(found.items(), key=lambda kv: kv[0].lower()))


def _spellings(model_id: str) -> set[str]:
    """Lower-case spellings that name ``model_id``."""
    org, name = model_id.split("/")
    names = {name}
    if name.endswith("-hf"):
        names.add(name[: -len("-hf")])
    if name.startswith("Llama-3"):
        names.add("Meta-" + name)
    if name.startswith("Meta-Llama-3"):
        names.add(name[len("Meta-") :])
    out = set()
    for n in names:
        out.add(f"{org}/{n}".lower())
        out.add(n.lower())
    return out


@functools.cache
def _index() -> dict[str, str]:
    """Every accepted spelling mapped to a catalog id; ambiguous bare names are left out."""
    owners: dict[str, set[str]] = {}
    for model_id in entries():
        for spelling in _spellings(model_id):
            owners.setdefault(spelling, set()).add(model_id)
    return {s: next(iter(ids)) for s, ids in owners.items() if len(ids) == 1}


def resolve(reference: str) -> CatalogHit | None:
    """The catalog entry a reference names, or None.

    Variants from ``aliases.json`` are looked up after direct names, by the same spellings.
    """
    key = reference.strip().strip("/").lower()
    index = _index()
    if key in index:
        model_id = index[key]
        return CatalogHit(model_id, entries()[model_id], {}, "")
    variant = _variant_index().get(key)
    if variant is None:
        return None
    base = variant["base"]
    return CatalogHit(
        variant["id"],
        entries()[base],
        dict(variant.get("overrides", {})),
        f"{variant['id']} is not packaged; using the config of {base} ({variant['why']})",
    )


@functools.cache
def _variant_index() -> dict[str, dict[str, Any]]:
    """Spellings of the variants in aliases.json mapped to their entry (plus its ``id``)."""
    data = json.loads((CATALOG_DIR / "aliases.json").read_text())
    out: dict[str, dict[str, Any]] = {}
    for variant_id, entry in data["variants"].items():
        for spelling in _spellings(variant_id):
            out.setdefault(spelling, {**entry, "id": variant_id})
    return out


QUANTIZED_SUFFIXES: tuple[tuple[str, str], ...] = (
    (r"-AWQ", "awq"),
    (r"-GPTQ(?:-Int[48])?", "gptq"),
    (r"-FP8(?:-Dynamic)?", "fp8"),
    (r"-(?:unsloth-)?bnb-4bit", "nf4"),
    (r"-GGUF", "q4_k_m"),
    (r"-MXFP4", "mxfp4"),
)
"""The name endings of a quantized checkpoint's Hub repository (``Qwen/Qwen2.5-7B-Instruct-AWQ``,
``...-GPTQ-Int4``, ``...-FP8``, unsloth's ``...-bnb-4bit``, ``...-GGUF``), each with the ``quantization``
value memest applies to the unquantized model for it (a GGUF repository: llama.cpp's Q4_K_M, Ollama's
default file type)."""


def unquantized(reference: str) -> tuple[str, str] | None:
    """The catalog model a quantized checkpoint's name was made from, and the ``quantization`` value that stands
    for its quantization: ``Qwen/Qwen2.5-7B-Instruct-AWQ`` -> (``Qwen/Qwen2.5-7B-Instruct``, ``awq``); None when
    the name has no :data:`QUANTIZED_SUFFIXES` ending or what is left is not in the catalog."""
    for suffix, quantization in QUANTIZED_SUFFIXES:
        m = re.match(rf"^(.+?){suffix}$", reference.strip(), flags=re.IGNORECASE)
        if m is None:
            continue
        stem = m.group(1)
        # a re-uploader's organisation (unsloth/, TheBloke/) is not the model's: the name alone is tried too
        hit = resolve(stem) or (resolve(stem.rsplit("/", 1)[1]) if "/" in stem else None)
        if hit is not None:
            return hit.model_id, quantization
    return None


def close_matches(reference: str, n: int = 3) -> list[str]:
    """Catalog ids that look like ``reference`` (for 'did you mean' messages)."""
    ids = list(entries())
    by_lower = {i.lower(): i for i in ids}
    names = {i.split("/")[1].lower(): i for i in ids}
    key = reference.strip().lower()
    hits = difflib.get_close_matches(key, list(by_lower), n=n, cutoff=0.5)
    out = [by_lower[h] for h in hits]
    for h in difflib.get_close_matches(key.split("/")[-1], list(names), n=n, cutoff=0.5):
        if names[h] not in out:
            out.append(names[h])
    return out[:n]


def load(hit: CatalogHit) -> dict[str, Any]:
    """The config dict of a hit, with the variant's overrides applied."""
    raw: dict[str, Any] = json.loads(hit.path.read_text())
    target = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    target.update(hit.overrides)
    sidecar = hit.path.with_name(HF_QUANT_CONFIG)
    if "quantization_config" not in raw and sidecar.is_file():
        raw["quantization_config"] = {"quant_method": "modelopt", **json.loads(sidecar.read_text())}
    return raw


HF_QUANT_CONFIG = "hf_quant_config.json"
"""A ModelOpt checkpoint's quantization file next to config.json, packaged where the catalog's config.json source
left quantization_config out: read as that checkpoint's ``quantization_config`` (``quant_method: modelopt``), as vLLM
reads it (``ModelOptQuantConfigBase.get_config_filenames``, ``vllm/model_executor/layers/quantization/modelopt.py``
at vllm-project/vllm commit 00155cde)."""
