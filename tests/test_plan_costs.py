"""The cost table: money first, then communication, then disruption; prices the user can override."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memest.devices import get_device
from memest.errors import InputError, UnknownDeviceError
from memest.planning.costs import (
    PER_DOUBLING,
    Cost,
    PriceTable,
    doubling_penalty,
    parse_cost_flags,
    penalty,
    read_cost_file,
)
from memest.planning.search import DeviceChoice, Space, plan
from memest.sources import load_model
from memest.workload import Offload, Parallelism, Recompute, TrainingConfig


def test_costs_compare_money_then_communication_then_disruption_then_changes():
    cheap_but_disruptive = Cost(1.6, 0.0, 40.0, 5)
    dear_and_plain = Cost(3.0, 0.0, 0.0, 0)
    assert cheap_but_disruptive < dear_and_plain
    assert Cost(3.0, 1.0, 0.0, 1) > Cost(3.0, 0.0, 30.0, 4)  # communication before disruption
    assert Cost(3.0, 0.0, 1.0, 0) > Cost(3.0, 0.0, 0.0, 3)  # disruption before the number of changes
    assert Cost(3.0, 0.0, 0.0, 2) > Cost(3.0, 0.0, 0.0, 1)


@pytest.mark.parametrize(("setting", "factor", "expected"), [
    ("tp", 1, (0.0, 0.0)),
    ("tp", 8, (3.0, 0.0)),  # three doublings x 1
    ("pp", 4, (4.0, 0.0)),  # two doublings x 2
    ("micro_batch", 8, (0.0, 3.0)),  # micro-batch 8 -> 1: three halvings x 1
    ("micro_batch", 3, (0.0, math.log2(3))),  # not a power of two: log2 of the ratio
])
def test_doubling_penalties(setting, factor, expected):
    assert doubling_penalty(setting, factor) == pytest.approx(expected)


def test_penalties_are_looked_up_by_value_and_enum():
    assert penalty("recompute", Recompute.FULL) is penalty("recompute", "full")
    assert penalty("recompute", Recompute.NONE).disruption == 0
    assert penalty("zero_stage", 3).communication > penalty("zero_stage", 2).communication == 0
    assert penalty("offload", Offload.PARAMS).disruption > penalty("offload", Offload.OPTIMIZER).disruption
    assert not penalty("method", "lora").lossless and penalty("recompute", "full").lossless
    assert penalty("unknown_setting", 1).disruption == 0


def _documented_rows() -> dict[str, tuple[float, float, bool]]:
    """The table of DESIGN.md's "Costs" section."""
    design = (Path(__file__).resolve().parent.parent / "DESIGN.md").read_text()
    section = design.split("### Costs", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[3] in ("yes", "no"):
            rows[cells[0]] = (float(cells[1] or 0), float(cells[2] or 0), cells[3] == "yes")
    return rows


def test_the_documented_table_matches_the_data():
    # DESIGN.md's table is what users read; its numbers must be the ones used
    from memest.planning import costs

    rows = _documented_rows()
    for name, p in PER_DOUBLING.items():
        label = "micro-batch halved" if name == "micro_batch" else f"{name} (per doubling)"
        match = [v for k, v in rows.items() if k.startswith(label)]
        assert match == [(p.communication, p.disruption, p.lossless)], name
    for setting, values in costs.PENALTIES.items():
        for value, p in values.items():
            label = f"{setting} {value}"
            assert rows[label] == (p.communication, p.disruption, p.lossless), label


def test_a_plans_cost_is_its_parts_by_hand():
    # Llama-2-7B full training, micro-batch 4 asked, on A10G (24 GiB) at 1.0 $/h: whatever the planner
    # picks, its cost must be the table's sum for that setup.
    spec = load_model("meta-llama/Llama-2-7b-hf")
    result = plan(spec, TrainingConfig(micro_batch_size=4), Space(devices=(DeviceChoice(get_device("A10G"), 64),)),
                  max_queries=False)
    s = result.best.setup
    w, par = s.workload, s.workload.parallelism
    comm = math.log2(par.tp) * 1 + math.log2(par.pp) * 2 + (1 if par.zero_stage == 3 else 0)
    dis = ({"none": 0, "selective": 1, "full": 4}[w.recompute.value] + math.log2(4 // w.micro_batch_size)
           + {"adamw": 0, "adamw8bit": 3}[w.optimizer.value] + {"none": 0, "optimizer": 6, "params": 10}[w.offload.value])
    assert s.cost.usd_per_hour == pytest.approx(s.count * 1.0)
    assert s.cost.communication == pytest.approx(comm)
    assert s.cost.disruption == pytest.approx(dis)


def test_price_overrides_accept_aliases_and_keep_the_rest():
    table = PriceTable.catalog().with_overrides({"h100": 2.49, "NVIDIA A10G": 0.75})
    assert table.price(get_device("H100-80GB")) == 2.49
    assert table.price(get_device("A10G")) == 0.75
    assert table.price(get_device("L4")) == get_device("L4").hourly_usd


@pytest.mark.parametrize(("overrides", "error", "message"), [
    ({"H100": -1.0}, InputError, "price -1.0 for 'H100' must be a non-negative number"),
    ({"H100": float("nan")}, InputError, "must be a non-negative number"),
    ({"H1000": 1.0}, UnknownDeviceError, "unknown device 'H1000'"),
])
def test_bad_price_overrides(overrides, error, message):
    with pytest.raises(error, match=message):
        PriceTable.catalog().with_overrides(overrides)


def test_cost_flags():
    assert parse_cost_flags(["H100=2.49", " L4 = 0.5"]) == {"H100": 2.49, "L4": 0.5}
    with pytest.raises(InputError, match=r"^cost 'H100' must be NAME=USD, e.g. cost H100=2.49$"):
        parse_cost_flags(["H100"])
    with pytest.raises(InputError, match=r"^cost 'H100=cheap': 'cheap' is not a number"):
        parse_cost_flags(["H100=cheap"])


def test_cost_file(tmp_path):
    good = tmp_path / "prices.json"
    good.write_text(json.dumps({"H100": 2.49, "A100-80GB": 1}))
    assert read_cost_file(good) == {"H100": 2.49, "A100-80GB": 1.0}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="is not valid JSON"):
        read_cost_file(bad)
    bad.write_text(json.dumps({"H100": "2.49"}))
    with pytest.raises(InputError, match="must hold a JSON object of device name -> USD per hour"):
        read_cost_file(bad)
    with pytest.raises(InputError, match="no such file"):
        read_cost_file(tmp_path / "missing.json")


def test_zero_stage_one_and_two_cost_no_communication_but_count_as_changes():
    # ZeRO-1/2 move the same bytes as DDP's all-reduce (ZeRO paper §7.2.1); of two setups equal in
    # money, communication and disruption, the planner prefers the one with fewer changed settings.
    spec = load_model("meta-llama/Llama-2-7b-hf")
    result = plan(spec, TrainingConfig(parallelism=Parallelism()), Space(devices=(DeviceChoice(get_device("MI300X"), 8),)),
                  max_queries=False)
    # 16 B/param x 6.74e9 = 100.4 GiB of model states: fits one 192 GiB MI300X with no change at all
    assert result.best.setup.count == 1 and result.best.setup.cost == Cost(3.0, 0.0, 0.0, 0)
