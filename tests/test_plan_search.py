"""The planner: what it returns fits, nothing cheaper that fits was skipped, and the search space
keeps the rules (TP within a node and dividing the heads, PP dividing the layers for training and at most
the layers for serving, global batch held).

The brute force below enumerates the documented search space on its own (its own loops, not the
planner's), estimates every setup and takes the cheapest fit per device type; the planner, with and
without pruning, must find a setup of exactly that cost.
"""

from __future__ import annotations

import itertools
import math

import pytest

from memest.devices import Device, get_device
from memest.errors import InputError
from memest.estimate import estimate
from memest.planning.costs import Cost, PriceTable, doubling_penalty, penalty
from memest.planning.fit import usable_bytes, verdict
from memest.planning.search import DEFAULT_HOST_MEMORY_BYTES, DeviceChoice, Space, device_counts, plan, widenings
from memest.sources import load_model
from memest.workload import (
    Method,
    Offload,
    Optimizer,
    Parallelism,
    Recompute,
    ServingConfig,
    TrainingConfig,
    validate,
)

HEADROOM = 0.10


# ---- an independent brute force over the documented space ----


def _powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _brute_training(spec, asked: TrainingConfig, device: Device, max_count: int, *, allow_method_change: bool,
                    global_batch: int | None, price: float):
    """Every setup of the documented training space on one device type: (cost, workload, count)."""
    for n in _powers_of_two(max_count):
        for tp in _divisors(device.per_node):
            for pp in _divisors(spec.num_layers):
                if n % (tp * pp):
                    continue
                dp = n // (tp * pp)
                per_replica = asked.micro_batch_size * asked.grad_accum_steps if global_batch is None else global_batch / dp
                zeros = [z for z in range(4) if z >= asked.parallelism.zero_stage]  # one replica too (ZeRO-Offload)
                sps = [False] if tp == 1 else [False, True]
                recs = [r for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)]
                mbs = [b for b in _divisors(asked.micro_batch_size) if per_replica == int(per_replica) and int(per_replica) % b == 0]
                opts = [Optimizer.ADAMW, Optimizer.ADAMW8BIT]
                offs = [Offload.NONE, Offload.OPTIMIZER, Offload.PARAMS]
                methods = [Method.FULL, Method.LORA, Method.QLORA] if allow_method_change else [Method.FULL]
                for z, sp, rec, b, opt, off, method in itertools.product(zeros, sps, recs, mbs, opts, offs, methods):
                    if off is Offload.OPTIMIZER and z == 0 or off is Offload.PARAMS and z != 3:
                        continue
                    par = Parallelism(tp=tp, pp=pp, dp=dp, zero_stage=z, sequence_parallel=sp)
                    w = asked.replace(parallelism=par, recompute=rec, micro_batch_size=b,
                                      grad_accum_steps=int(per_replica) // b, optimizer=opt, offload=off, method=method)
                    try:
                        validate(spec, w)
                    except InputError:
                        continue
                    comm = sum(doubling_penalty(name, d)[0] for name, d in (("tp", tp), ("pp", pp)))
                    comm += penalty("zero_stage", z).communication
                    parts = [penalty("zero_stage", z), penalty("sequence_parallel", sp), penalty("recompute", rec),
                             penalty("optimizer", opt), penalty("offload", off), penalty("method", method)]
                    dis = sum(p.disruption for p in parts) + doubling_penalty("micro_batch", asked.micro_batch_size // b)[1]
                    changes = (tp > 1) + (pp > 1) + sum(p.why != "" for p in parts) + (b != asked.micro_batch_size)
                    yield Cost(n * price, comm, dis, changes), w, n


def _brute_serving(spec, asked: ServingConfig, device: Device, max_count: int, *, allow_quantization: bool, price: float):
    for n in _powers_of_two(max_count):
        for tp in _divisors(device.per_node):
            if n % tp or n // tp > spec.num_layers:  # vLLM splits layers unevenly: any pp up to num_layers
                continue
            pp = n // tp
            quants = ["none", "int8", "int4"] + (["fp8"] if device.fp8 else []) if allow_quantization else ["none"]
            kvs = ["auto", "fp8"] if allow_quantization else ["auto"]
            for q, kv in itertools.product(quants, kvs):
                w = asked.replace(parallelism=Parallelism(tp=tp, pp=pp), quantization=q, kv_cache_dtype=kv)
                try:
                    validate(spec, w)
                except InputError:
                    continue
                comm = doubling_penalty("tp", tp)[0] + doubling_penalty("pp", pp)[0]
                dis = penalty("quantization", q).disruption + penalty("kv_cache_dtype", kv).disruption
                changes = (tp > 1) + (pp > 1) + (q != "none") + (kv != "auto")
                yield Cost(n * price, comm, dis, changes), w, n


def _cheapest_fit(setups, spec, device, host_limit=DEFAULT_HOST_MEMORY_BYTES):
    """The least cost among setups that fit the device and, with offload, the host RAM limit."""
    best = None
    for cost, w, n in setups:
        if best is not None and cost >= best:
            continue
        est = estimate(spec, w, device)
        if verdict(est, device, n, HEADROOM).fits and est.host_bytes <= host_limit:
            best = cost
    return best


def _costs_close(a: Cost, b: Cost) -> bool:
    return a.usd_per_hour == pytest.approx(b.usd_per_hour) and a.communication == pytest.approx(b.communication) \
        and a.disruption == pytest.approx(b.disruption) and a.changes == b.changes


TRAINING_CASES = [
    pytest.param("meta-llama/Llama-2-7b-hf", TrainingConfig(micro_batch_size=2, seq_len=4096), ("L4", "A100-80GB"), 8,
                 False, None, id="llama2-7b-full-L4-A100"),
    pytest.param("Qwen/Qwen2.5-7B", TrainingConfig(micro_batch_size=4, seq_len=2048), ("A10G", "H100"), 8,
                 True, 16, id="qwen2.5-7b-lora-allowed-global-batch-16"),
    pytest.param("meta-llama/Llama-3.2-3B", TrainingConfig(micro_batch_size=2, seq_len=8192), ("T4", "RTX-4090"), 8,
                 False, None, id="llama3.2-3b-small-gpus-24-heads-28-layers"),
    pytest.param("Qwen/Qwen2.5-0.5B", TrainingConfig(micro_batch_size=4, seq_len=32768, recompute=Recompute.NONE),
                 ("T4", "L4"), 4, False, None, id="qwen2.5-0.5b-long-seq"),
    # A case the floor values decide: with only most-saving values as floors, pruning skips the layout
    # of the cheapest fit here (tp 2 · pp 4 · dp 2 with ZeRO-1 on 16 T4s).
    pytest.param("Qwen/Qwen2.5-0.5B", TrainingConfig(micro_batch_size=1, seq_len=16384), ("T4",), 16, False, None,
                 id="qwen2.5-0.5b-16k-on-T4-needs-the-floor-values"),
    pytest.param("deepseek-ai/DeepSeek-V2-Lite", TrainingConfig(micro_batch_size=2, seq_len=4096), ("A100-80GB", "L40S"), 8,
                 True, None, id="deepseek-v2-lite-moe-mla"),
    pytest.param("google/gemma-2-2b", TrainingConfig(micro_batch_size=8, seq_len=8192), ("L4", "RTX-3090"), 8,
                 False, 64, id="gemma2-2b-8-heads-4-kv-global-batch-64"),
    pytest.param("bigscience/T0_3B", TrainingConfig(micro_batch_size=4, seq_len=1024), ("T4", "A10G"), 4,
                 False, None, id="t0-3b-seq2seq"),
]


@pytest.mark.parametrize(("model", "asked", "devices", "max_count", "allow_method_change", "global_batch"), TRAINING_CASES)
def test_training_plan_matches_brute_force(model, asked, devices, max_count, allow_method_change, global_batch):
    spec = load_model(model)
    prices = PriceTable.catalog()
    choices = tuple(DeviceChoice(get_device(d), max_count) for d in devices)
    space = Space(allow_offload=True, devices=choices, prices=prices, allow_method_change=allow_method_change, global_batch_size=global_batch)
    pruned = plan(spec, asked, space, headroom=HEADROOM, max_queries=False)
    unpruned = plan(spec, asked, space, headroom=HEADROOM, max_queries=False, prune=False)
    for choice in choices:
        device = choice.device
        brute = _cheapest_fit(_brute_training(spec, asked, device, max_count, allow_method_change=allow_method_change,
                                              global_batch=global_batch, price=prices.price(device)), spec, device)
        for result in (pruned, unpruned):
            found = [f for f in result.fits if f.setup.device == device]
            if brute is None:
                assert not found and choice in result.no_fit
                continue
            assert len(found) == 1, f"{device.name}: planner found nothing, brute force found {brute}"
            assert _costs_close(found[0].setup.cost, brute), (device.name, found[0].setup.cost, brute)


SERVING_CASES = [
    pytest.param("meta-llama/Llama-2-70b-hf", ServingConfig(max_model_len=4096, batch_size=8), ("L40S", "H100", "A100-40GB"),
                 16, True, id="llama2-70b-quantization-allowed"),
    pytest.param("meta-llama/Llama-3.1-8B", ServingConfig(max_model_len=32768, batch_size=16), ("L4", "A10G", "T4"), 8,
                 False, id="llama3.1-8b-bf16-small-gpus"),
    pytest.param("Qwen/Qwen2-7B", ServingConfig(max_model_len=16384, batch_size=4), ("L4", "RTX-3090"), 8, True,
                 id="qwen2-7b-28-heads-4-kv"),
    pytest.param("mistralai/Mixtral-8x7B-v0.1", ServingConfig(max_model_len=32768, batch_size=8), ("L40S", "H100"), 16, True,
                 id="mixtral-8x7b-moe"),
    pytest.param("tiiuae/falcon-7b", ServingConfig(max_model_len=2048, batch_size=64), ("T4", "L4"), 8, False,
                 id="falcon-7b-71-heads-mqa"),
    pytest.param("ai21labs/Jamba-v0.1", ServingConfig(max_model_len=65536, batch_size=4), ("A100-80GB", "L40S"), 16, True,
                 id="jamba-mamba-moe"),
    # 61 layers (prime): every pp > 1 splits unevenly, as vLLM does
    pytest.param("deepseek-ai/DeepSeek-V3", ServingConfig(max_model_len=32768, batch_size=4), ("H100", "A100-80GB", "L40S"),
                 64, False, id="deepseek-v3-61-layers"),
]


@pytest.mark.parametrize(("model", "asked", "devices", "max_count", "allow_quantization"), SERVING_CASES)
def test_serving_plan_matches_brute_force(model, asked, devices, max_count, allow_quantization):
    spec = load_model(model)
    prices = PriceTable.catalog()
    choices = tuple(DeviceChoice(get_device(d), max_count) for d in devices)
    result = plan(spec, asked, Space(allow_offload=True, devices=choices, prices=prices, allow_quantization=allow_quantization),
                  headroom=HEADROOM, max_queries=False)
    for choice in choices:
        device = choice.device
        brute = _cheapest_fit(_brute_serving(spec, asked, device, max_count, allow_quantization=allow_quantization,
                                             price=prices.price(device)), spec, device)
        found = [f for f in result.fits if f.setup.device == device]
        if brute is None:
            assert not found
        else:
            assert len(found) == 1 and _costs_close(found[0].setup.cost, brute), (device.name, found, brute)


def test_a_zero_price_searches_every_count():
    # Free devices: money ties at 0 for every count, so a larger count with less communication or
    # disruption must win when it exists. Llama-2-7B full training on L4 (24 GiB): the brute force
    # over 1..16 devices decides; a search that stopped at the first fitting count would not match.
    spec = load_model("meta-llama/Llama-2-7b-hf")
    asked = TrainingConfig(micro_batch_size=1, seq_len=2048)
    device = get_device("L4")
    prices = PriceTable.catalog().with_overrides({"L4": 0.0})
    result = plan(spec, asked, Space(allow_offload=True, devices=(DeviceChoice(device, 16),), prices=prices), headroom=HEADROOM,
                  max_queries=False)
    brute = _cheapest_fit(_brute_training(spec, asked, device, 16, allow_method_change=False, global_batch=None,
                                          price=0.0), spec, device)
    assert result.best is not None and _costs_close(result.best.setup.cost, brute)
    assert result.best.setup.cost.usd_per_hour == 0


# ---- what the planner returns fits, and keeps the rules ----


RULE_CASES = [
    pytest.param("meta-llama/Llama-2-70b-hf", TrainingConfig(micro_batch_size=4, seq_len=4096), {}, id="llama2-70b-train"),
    pytest.param("Qwen/Qwen2-7B", TrainingConfig(micro_batch_size=8, seq_len=8192), {"allow_method_change": True},
                 id="qwen2-7b-train-28-heads"),
    pytest.param("meta-llama/Llama-3.2-3B", ServingConfig(max_model_len=131072, batch_size=32),
                 {"allow_quantization": True}, id="llama3.2-3b-serve-128k"),
    pytest.param("meta-llama/Llama-3.1-405B", ServingConfig(max_model_len=8192, batch_size=4), {}, id="llama3.1-405b-serve"),
]


@pytest.mark.parametrize(("model", "asked", "allow"), RULE_CASES)
def test_every_fit_fits_by_an_independent_estimate_and_keeps_the_rules(model, asked, allow):
    spec = load_model(model)
    devices = ("H100", "A100-40GB", "L4", "RTX-4090", "MI300X", "TPU-v5e")
    space = Space(allow_offload=True, devices=tuple(DeviceChoice(get_device(d), 256) for d in devices), **allow)
    result = plan(spec, asked, space, headroom=HEADROOM, max_queries=False)
    assert result.fits
    for f in result.fits:
        s = f.setup
        par = s.workload.parallelism
        again = estimate(spec, s.workload, s.device)
        assert again.per_device.device_used_bytes <= usable_bytes(s.device, HEADROOM)
        assert par.world_size == s.count
        assert s.device.per_node % par.tp == 0  # tensor parallelism stays within a node
        assert spec.num_heads % par.tp == 0
        if isinstance(asked, TrainingConfig):
            assert spec.num_layers % par.pp == 0  # training: even stages
        else:
            assert par.pp <= spec.num_layers  # serving: vLLM splits any pp up to num_layers
        assert s.cost.usd_per_hour == pytest.approx(s.count * s.device.hourly_usd)
        if isinstance(asked, TrainingConfig):
            # the per-replica batch (micro-batch x accumulation) is held
            assert s.workload.micro_batch_size * s.workload.grad_accum_steps == asked.micro_batch_size * asked.grad_accum_steps
            assert asked.micro_batch_size % s.workload.micro_batch_size == 0
            if not allow.get("allow_method_change"):
                assert s.workload.method is Method.FULL
        else:
            assert par.dp == 1
            if not allow.get("allow_quantization"):
                assert (s.workload.quantization, s.workload.kv_cache_dtype) == ("none", "auto")
    costs = [f.setup.cost for f in result.fits]
    assert costs == sorted(costs)


def test_global_batch_size_is_held_exactly():
    spec = load_model("meta-llama/Llama-2-13b-hf")
    asked = TrainingConfig(micro_batch_size=4, seq_len=4096)
    space = Space(allow_offload=True, devices=(DeviceChoice(get_device("A100-80GB"), 64), DeviceChoice(get_device("H100"), 64)),
                  global_batch_size=64)
    result = plan(spec, asked, space, headroom=HEADROOM, max_queries=False)
    assert result.fits
    for f in result.fits:
        w = f.setup.workload
        assert w.micro_batch_size * w.grad_accum_steps * w.parallelism.dp == 64


def test_rtx_cards_one_per_server_never_use_tensor_parallelism():
    spec = load_model("meta-llama/Llama-2-13b-hf")
    device = get_device("RTX-4090")
    assert device.per_node == 1
    # vLLM holds gpu_memory_utilization x 24 GiB + 2.42 GiB outside its budget with pp > 1 (CUDA graphs
    # 0.91, context 0.51, NCCL 1.0): 0.85 leaves room for it, the default 0.9 does not (memest.planning.fit)
    job = ServingConfig(max_model_len=4096, gpu_memory_utilization=0.85)
    result = plan(spec, job, Space(allow_offload=True, devices=(DeviceChoice(device, 16),)), max_queries=False)
    assert result.best is not None and result.best.setup.workload.parallelism.tp == 1
    assert result.best.setup.workload.parallelism.pp > 1


def test_money_comes_before_communication_and_disruption():
    # Llama-2-13B served at 4k context by vLLM at gpu_memory_utilization 0.85. Its bf16 weights,
    # 13,015,864,320 x 2 B = 24.24 GiB, exceed one L4's budget of 0.85 x 24 GiB = 20.4 GiB, so L4 needs
    # tp 2 (2 x 0.8 = 1.6 $/h, communication 1), where vLLM holds 20.4 + 2.42 GiB outside its budget
    # (CUDA graphs, context, NCCL) < 24 GiB; one H100 (3.0 $/h) fits as asked. Cheaper money wins
    # despite the communication.
    spec = load_model("meta-llama/Llama-2-13b-hf")
    assert 2 * spec.num_params > 0.85 * 24 * 2**30
    space = Space(allow_offload=True, devices=(DeviceChoice(get_device("H100"), 8), DeviceChoice(get_device("L4"), 8)))
    job = ServingConfig(max_model_len=4096, batch_size=1, gpu_memory_utilization=0.85)
    result = plan(spec, job, space, max_queries=False)
    assert [f.setup.device.name for f in result.fits] == ["L4", "H100-80GB"]
    l4, h100 = result.fits
    assert l4.setup.cost == Cost(1.6, 1.0, 0.0, 1)
    assert l4.setup.workload.parallelism.tp == 2
    assert h100.setup.cost == Cost(3.0, 0.0, 0.0, 0)


def test_price_overrides_change_the_ranking():
    spec = load_model("meta-llama/Llama-2-13b-hf")
    choices = (DeviceChoice(get_device("H100"), 8), DeviceChoice(get_device("L4"), 8))
    prices = PriceTable.catalog().with_overrides({"L4": 5.0})
    job = ServingConfig(max_model_len=4096, gpu_memory_utilization=0.85)  # L4 at tp 2: see the test above
    result = plan(spec, job, Space(allow_offload=True, devices=choices, prices=prices), max_queries=False)
    assert result.fits[0].setup.device.name == "H100-80GB"
    assert result.fits[1].setup.cost.usd_per_hour == pytest.approx(2 * 5.0)


def test_nothing_fits_within_the_limit():
    spec = load_model("meta-llama/Llama-3.1-405B")
    choice = DeviceChoice(get_device("L4"), 4)
    result = plan(spec, TrainingConfig(), Space(allow_offload=True, devices=(choice,)), max_queries=False)
    assert result.fits == () and result.no_fit == (choice,)
    # 405.85e9 params x 2 B of bf16 weights alone over 4 x 24 GiB: far beyond, whatever the setup
    assert 2 * spec.num_params / 4 > 24 * 2**30


@pytest.mark.parametrize(("space", "message"), [
    (Space(allow_offload=True, devices=()), "no device type to plan for"),
    (Space(allow_offload=True, devices=(DeviceChoice(get_device("H100"), 0),)), "must be at least 1"),
    (Space(allow_offload=True, devices=(DeviceChoice(get_device("H100"), 8),), global_batch_size=0), "^global_batch_size is 0"),
])
def test_bad_spaces_are_input_errors(space, message):
    spec = load_model("meta-llama/Llama-2-7b-hf")
    with pytest.raises(InputError, match=message):
        plan(spec, TrainingConfig(), space)


def test_a_workload_invalid_whatever_the_layout_is_reported_not_hidden():
    spec = load_model("meta-llama/Llama-2-7b-hf")
    with pytest.raises(InputError, match="^seq_len is 0"):
        plan(spec, TrainingConfig(seq_len=0), Space(allow_offload=True, devices=(DeviceChoice(get_device("H100"), 8),)))


@pytest.mark.parametrize(("device", "max_count", "min_count", "expected"), [
    ("H100", 64, 1, [1, 2, 4, 8, 16, 32, 64]),
    ("GB200", 150, 1, [1, 2, 4, 8, 16, 32, 64, 72, 128, 144]),  # 72 per NVL72 rack: whole racks too
    ("H100", 64, 3, [3, 4, 8, 16, 32, 64]),  # memest hf starts at the count asked
    ("TPU-v4", 8, 1, [1, 2, 4, 8]),
])
def test_device_counts(device, max_count, min_count, expected):
    assert device_counts(get_device(device), max_count, min_count) == expected


# ---- the monotonicity the pruning relies on ----

MONOTONE_MODELS = ["meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-3B", "Qwen/Qwen2-72B",
                   "deepseek-ai/DeepSeek-V2-Lite", "google/gemma-2-9b", "ai21labs/Jamba-v0.1", "openai/gpt-oss-20b"]


def _used(spec, w, device) -> int:
    return estimate(spec, w, device).per_device.device_used_bytes


@pytest.mark.parametrize("model", MONOTONE_MODELS)
@pytest.mark.parametrize(("tp", "pp", "dp"), [(1, 1, 1), (2, 2, 2), (8, 1, 4), (1, 4, 1)])
def test_steps_from_non_floor_values_do_not_raise_memory(model, tp, pp, dp):
    # What the pruning assumes (plan.FLOOR_VALUES): one step towards saving, from a value that is
    # not a floor value, never raises memory. Steps the estimator rejects are skipped.
    spec = load_model(model)
    if spec.num_heads % tp or spec.num_layers % pp or (tp > spec.num_kv_heads and tp % spec.num_kv_heads):
        pytest.skip("layout not valid for this model")
    device = get_device("H100")
    for zero in ([0] if dp == 1 else [1, 2, 3]):
        par = Parallelism(tp=tp, pp=pp, dp=dp, zero_stage=zero)
        base = TrainingConfig(micro_batch_size=4, seq_len=2048, grad_accum_steps=2, parallelism=par)
        steps = [
            [base, base.replace(micro_batch_size=2, grad_accum_steps=4), base.replace(micro_batch_size=1, grad_accum_steps=8)],
            [base, base.replace(optimizer=Optimizer.ADAMW8BIT)],
            [base, base.replace(recompute=Recompute.SELECTIVE)],
            # no method step: every method is a floor value (plan.FLOOR_VALUES; LoRA's fp32 input copies are
            # replicated on tensor-parallel ranks and can outweigh what it saves)
            [base, base.replace(offload=Offload.OPTIMIZER), base.replace(offload=Offload.PARAMS)],
        ]
        if tp > 1:
            steps.append([base, base.replace(parallelism=Parallelism(tp=tp, pp=pp, dp=dp, zero_stage=zero,
                                                                      sequence_parallel=True))])
        for chain in steps:
            used = []
            for w in chain:
                try:
                    used.append(_used(spec, w, device))
                except InputError:
                    break
            assert used == sorted(used, reverse=True), (model, chain, used)


@pytest.mark.parametrize("model", MONOTONE_MODELS)
def test_serving_memory_does_not_grow_along_the_saving_order(model):
    spec = load_model(model)
    device = get_device("H100")
    base = ServingConfig(max_model_len=4096, batch_size=8)
    if spec.quantization is None:  # the planner offers quantization only for unquantized checkpoints
        used = [_used(spec, base.replace(quantization=q), device) for q in ("none", "fp8", "int8", "int4")]
        assert used[0] >= max(used[1:]) and used[3] <= min(used[:3])
    assert _used(spec, base.replace(kv_cache_dtype="fp8"), device) <= _used(spec, base, device)


def test_pruning_saves_estimates():
    # pruning skips the setups that save less than one that does not fit the device; the host RAM limit of
    # offloaded setups is checked after (Searcher.fits), so the saving is measured where the device is the
    # only limit (with offload, FSDP's host-side gradients make many setups fit the device but not the host)
    spec = load_model("meta-llama/Llama-3.1-70B")
    space = Space(devices=(DeviceChoice(get_device("A100-80GB"), 64), DeviceChoice(get_device("H100"), 64)))
    pruned = plan(spec, TrainingConfig(micro_batch_size=4), space, max_queries=False)
    unpruned = plan(spec, TrainingConfig(micro_batch_size=4), space, max_queries=False, prune=False)
    assert [f.setup.cost for f in pruned.fits] == [f.setup.cost for f in unpruned.fits]
    assert pruned.fits and pruned.evaluated < 0.75 * unpruned.evaluated
    assert math.isclose(pruned.setups, unpruned.setups)


@pytest.mark.parametrize("host_gib", [0, 64, 4096])
def test_offloaded_states_must_fit_the_host_memory(host_gib):
    # Llama-2-70B full training on L4s: with more host RAM the planner may offload; every fit it
    # returns needs at most the host RAM allowed, and the brute force agrees on the cost.
    spec = load_model("meta-llama/Llama-2-70b-hf")
    asked = TrainingConfig(micro_batch_size=2)
    device = get_device("L4")
    limit = host_gib << 30
    result = plan(spec, asked, Space(allow_offload=True, devices=(DeviceChoice(device, 16),), host_memory_bytes=limit), max_queries=False)
    brute = _cheapest_fit(_brute_training(spec, asked, device, 16, allow_method_change=False, global_batch=None,
                                          price=device.hourly_usd), spec, device, limit)
    if brute is None:
        assert result.best is None
    else:
        assert result.best is not None and _costs_close(result.best.setup.cost, brute)
        assert result.best.estimate.host_bytes <= limit
    if host_gib == 0 and result.best is not None:
        assert result.best.setup.workload.offload is Offload.NONE


def test_consumer_cards_share_one_machines_host_ram():
    # Fresh-user report F4: consumer cards have no NVLink (per_node 1: no tensor parallelism) but sit 2-8 to a
    # machine, whose host RAM their offloaded states share. Llama-3.1-70B LoRA under the HF Trainer with DeepSpeed
    # ZeRO-3 parameter offload on 2 RTX-4090s: the frozen bf16 base goes to host RAM, whole, for the machine:
    # 70,553,706,496 params x 2 B = 141.1e9 B = 131.4 GiB (a shard of half of it per rank, two ranks) — the same
    # as on 2 A100s, which were always counted per 8-GPU server. Counting one 4090 per machine gave half.
    from memest.workload import resolve

    spec = load_model("meta-llama/Llama-3.1-70B")
    values = {"finetune": "lora", "recompute": "full", "offload": "params", "stack": "hf-trainer", "zero_stage": 3,
              "gpus": 2}
    rtx, a100 = get_device("RTX-4090"), get_device("A100-80GB")
    assert rtx.per_node == 1 and rtx.devices_per_machine == 8
    host = estimate(spec, resolve.resolve(values, spec, rtx), rtx).host_bytes
    assert host >= spec.num_params * 2 > 130 * 2**30
    assert host == estimate(spec, resolve.resolve(values, spec, a100), a100).host_bytes
    # and the planner holds it to the host RAM given: 96 GiB cannot take the 131.4 GiB base, 192 GiB can
    asked = resolve.resolve({k: v for k, v in values.items() if k != "gpus"}, spec, rtx)
    for host_gib, fits in ((96, False), (192, True)):
        space = Space(allow_offload=True, devices=(DeviceChoice(rtx, 2),), host_memory_bytes=host_gib << 30)
        result = plan(spec, asked, space, max_queries=False)
        best = result.best
        assert (best is not None) is fits, host_gib
        assert best is None or best.estimate.host_bytes <= host_gib << 30
        if not fits:  # and the advice names the host RAM as what rules it out
            assert widenings(result).widenings == ("host_memory_bytes",)


def _witness(pairs) -> bool:
    """True when, for some (model, setup) of the grid, the step's target needs more than its source."""
    device = get_device("H100")
    for model, source, target in pairs:
        spec = load_model(model)
        try:
            if _used(spec, target, device) > _used(spec, source, device):
                return True
        except InputError:
            continue
    return False


GRID = [(m, pp, seq) for m in ("meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B")
        for pp in (1, 4, 8, 16) for seq in (512, 8192)]


@pytest.mark.parametrize(("setting", "step"), [
    # ZeRO-3 adds a gather buffer of two unsharded layers and saves only 1/dp of a short stage's weights
    ("zero_stage 2 -> 3", lambda pp, seq: (TrainingConfig(seq_len=seq, parallelism=Parallelism(pp=pp, dp=2, zero_stage=2)),
                                          TrainingConfig(seq_len=seq, parallelism=Parallelism(pp=pp, dp=2, zero_stage=3)))),
    # full recompute rebuilds a whole layer in backward: for a one-layer stage, more than selective keeps
    ("recompute selective -> full", lambda pp, seq: (
        TrainingConfig(micro_batch_size=8, seq_len=seq, recompute=Recompute.SELECTIVE, parallelism=Parallelism(pp=pp)),
        TrainingConfig(micro_batch_size=8, seq_len=seq, recompute=Recompute.FULL, parallelism=Parallelism(pp=pp)))),
])
def test_each_floor_value_is_needed(setting, step):
    # Why FLOOR_VALUES lists these: a step towards saving from each of them can raise memory, so a
    # floor made of most-saving values alone could prune a layout where a setup fits. (LoRA is listed
    # for QLoRA's fp32 upcast of the unquantized weights, which depends on the training estimator's
    # peft preparation: kept as a precaution, not checked here.)
    pairs = [(model, *step(pp, seq)) for model, pp, seq in GRID if load_model(model).num_layers % pp == 0]
    assert _witness(pairs), setting


def test_a_quantized_checkpoint_is_not_quantized_again():
    # gpt-oss ships MXFP4 experts; "none" keeps them, and 8-bit would be larger, not smaller
    spec = load_model("openai/gpt-oss-20b")
    assert spec.quantization is not None
    result = plan(spec, ServingConfig(max_model_len=8192), Space(allow_offload=True, devices=(DeviceChoice(get_device("L4"), 8),),
                                                                 allow_quantization=True), max_queries=False)
    assert result.best is not None and result.best.setup.workload.quantization == "none"


def test_offload_only_when_allowed():
    # 70B full training on 24 GB cards fits only by offloading parameters to the host; without
    # --allow-offload the planner must not propose it (no throughput model ranks its slowness).
    spec = load_model("meta-llama/Llama-2-70b-hf")
    choice = DeviceChoice(get_device("L4"), 16)
    asked = TrainingConfig(seq_len=1024)
    allowed = plan(spec, asked, Space(allow_offload=True, devices=(choice,)), headroom=HEADROOM, max_queries=False)
    default = plan(spec, asked, Space(devices=(choice,)), headroom=HEADROOM, max_queries=False)
    assert allowed.best is not None and allowed.best.setup.workload.offload is not Offload.NONE
    assert all(f.setup.workload.offload is Offload.NONE for f in default.fits)


def test_zero_on_one_device_is_searched():
    # Fresh-user report F3: Mistral-7B LoRA under the HF Trainer on RTX-4090s (23.68 GiB, 21.31 usable at 10%
    # headroom). The Trainer alone keeps the model in fp32 under autocast: 7.24e9 x 4 B = 26.97 GiB > 21.31, so one
    # card without ZeRO cannot fit. With deepspeed=ds.json (any ZeRO stage, one process too) DeepSpeed's bf16
    # engine holds the base in bf16: 7.24e9 x 2 B = 13.49 GiB, leaving ~7.8 GiB for adapters, their states and
    # full-recompute activations at mbs 1 x 2048 — one card at 0.50 $/h, not the two (1.00 $/h) the planner chose
    # when it searched ZeRO only with dp > 1. The brute force resolves each setup as `memest hf` flags do.
    from memest.workload import resolve

    spec, device = load_model("mistralai/Mistral-7B-v0.1"), get_device("RTX-4090")
    base = {"finetune": "lora", "stack": "hf-trainer"}
    asked = resolve.resolve(base, spec, device)
    prices = PriceTable.catalog()
    space = Space(devices=(DeviceChoice(device, 8),), prices=prices, allow_optimizer_change=False, allow_batch_reshape=False)
    found = plan(spec, asked, space, headroom=HEADROOM, max_queries=False).best
    assert found is not None and found.setup.count == 1 and found.setup.workload.parallelism.zero_stage >= 1

    def setups():
        for n, z, rec in itertools.product((1, 2, 4, 8), range(4), (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)):
            w = resolve.resolve({**base, "gpus": n, "zero_stage": z, "recompute": rec.value}, spec, device)
            parts = [penalty("zero_stage", z), penalty("recompute", rec), penalty("method", Method.LORA)]
            changes = sum(p.why != "" for p in parts)
            yield Cost(n * prices.price(device), parts[0].communication, sum(p.disruption for p in parts), changes), w, n

    brute = _cheapest_fit(setups(), spec, device)
    assert brute is not None and brute.usd_per_hour == pytest.approx(prices.price(device))
    assert _costs_close(found.setup.cost, brute), (found.setup.cost, brute)
