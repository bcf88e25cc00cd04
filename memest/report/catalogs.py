"""The two catalogs as data: the offline models and the accelerators, as ``memest models --json`` and
``memest gpus --json`` print them (and the web service's ``/v1/models`` and ``/v1/gpus`` serve them)."""

from __future__ import annotations

from typing import Any


def models_list() -> list[dict[str, Any]]:
    """Every model of the offline catalog: name, model_type, num_params, num_layers, max_position_embeddings."""
    from memest.sources import catalog, load_model

    out = []
    for model_id in catalog.entries():
        spec = load_model(model_id)
        out.append({"name": model_id, "model_type": spec.model_type, "num_params": spec.num_params,
                    "num_layers": spec.num_layers, "max_position_embeddings": spec.max_position_embeddings})
    return out


def gpus_list() -> list[dict[str, Any]]:
    """Every device of the accelerator catalog, its memory in bytes, where the figure comes from, its aliases."""
    from memest.devices import DEVICES

    return [{"name": d.name, "memory_bytes": d.memory_bytes, "vendor": d.vendor, "kind": d.kind, "arch": d.arch,
             "per_node": d.per_node, "per_machine": d.devices_per_machine, "hourly_usd": d.hourly_usd, "capacity_basis": d.capacity_basis,
             "measured": d.measured, "source": d.source, "aliases": list(d.aliases)} for d in DEVICES]
