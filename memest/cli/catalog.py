"""``memest models`` and ``memest gpus``: the offline model catalog and the accelerator catalog."""

from __future__ import annotations

import json

import typer

from memest.cli.app import JsonOpt, _console, app


@app.command("models")
def models_command(
    json_: JsonOpt = False,
) -> None:
    """List the offline catalog: models memest knows without network."""
    from memest.report import count
    from memest.report.catalogs import models_list

    items = models_list()
    if json_:
        typer.echo(json.dumps(items, indent=2))
        return
    from memest.report.tables import Narrowest, name_col, new_table, number_col

    title = "memest offline catalog (sources: memest/catalog/SOURCES.md)"
    numbers = ("params", "layers", "max context")
    wide = new_table(name_col("model"), name_col("model_type"), *map(number_col, numbers), title=title)
    narrow = new_table(name_col("model (model_type)"), *map(number_col, numbers), title=title)  # the type below
    for m in items:
        n, t, p, layers, ctx = (m["name"], m["model_type"], m["num_params"], m["num_layers"],
                                m["max_position_embeddings"])
        wide.add_row(n, t, count(p), str(layers), f"{ctx:,}" if ctx else "-")
        narrow.add_row(f"{n}\n[dim]{t}[/dim]", count(p), str(layers), f"{ctx:,}" if ctx else "-")
    _console().print(Narrowest(wide, narrow))


@app.command("gpus")
def gpus_command(
    json_: JsonOpt = False,
) -> None:
    """List the accelerator catalog: memory per device and where each capacity comes from.

    A nominal capacity takes the vendor's "GB" as GiB (2^30 B), about what the driver reports (an
    "H100 80GB" shows 81,559 MiB in nvidia-smi, 79.19 GiB to CUDA); a size you give is exact:
    --gpu 32GB is 32 x 10^9 B (29.80 GiB), --gpu 32GiB is 32 x 2^30 B.
    """
    from memest.devices import DEVICES
    from memest.report import gib
    from memest.report.catalogs import gpus_list

    if json_:
        typer.echo(json.dumps(gpus_list(), indent=2))
        return
    from memest.report.tables import Narrowest, name_col, new_table, number_col, prose_col

    title = ("memest accelerator catalog (memory per device; GiB = 2^30 bytes). Capacity: measured = a published "
             "reading of the usable total, nominal = the vendor's \"GB\" read as GiB (about what the driver reports: "
             "an \"80GB\" card shows ~79-80 GiB), working set = Apple's Metal share of unified RAM. Any size also "
             "works, exactly as written: --gpu 32GB = 32 x 10^9 B (29.80 GiB), --gpu my-card:32GiB = 32 x 2^30 B")
    wide = new_table(name_col("device"), number_col("memory"), prose_col("capacity"), number_col("$/h"),
                     prose_col("source"), prose_col("aliases"), title=title)
    narrow = new_table(name_col("device"), number_col("memory"), number_col("$/h"),
                       prose_col("capacity: source (aliases)"), title=title)
    for d in DEVICES:
        price = "-" if d.hourly_usd is None else f"{d.hourly_usd:.2f}"
        aliases = ", ".join(d.aliases[:3])
        wide.add_row(d.name, gib(d.memory_bytes), d.capacity_basis, price, d.source, aliases)
        narrow.add_row(d.name, gib(d.memory_bytes), price,
                       f"{d.capacity_basis}: {d.source}" + (f" [dim]({aliases})[/dim]" if aliases else ""))
    _console().print(Narrowest(wide, narrow))
