"""The monotonicities README.md promises, checked with hypothesis over catalog models.

Each property quotes the README sentence (or the docstring of the setting) it rests on. The training
properties that ``tests/test_invariants.py`` already checks (memory never falls as micro-batch,
sequence, rank or layers grow; more ZeRO, dp, tp or pp never raise it) are not repeated; these are
the others: the three figures and their band, recompute, LoRA against full fine-tuning, expert
parallelism, FSDP model states, CPU offload, QLoRA's k-bit preparation, and serving (context, concurrency,
quantization, KV dtype, tp, gpu_memory_utilization).

Every property estimates in-process through the library (no subprocess) and runs few examples.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memest.devices import get_device
from memest.estimate import estimate
from memest.planning.fit import verdict
from memest.planning.recommend import assess
from memest.result import Kind
from memest.sources import load_model
from memest.workload import (
    AttnImplementation,
    Engine,
    KbitPrep,
    LoraConfig,
    Method,
    Offload,
    Parallelism,
    Precision,
    Recompute,
    ServingConfig,
    TrainingConfig,
)

DENSE = ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", "google/gemma-2-2b",
         "microsoft/phi-2", "EleutherAI/pythia-1b"]
MOE = ["Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-v0.1"]
SPECS = {m: load_model(m) for m in DENSE + MOE}
H100 = get_device("H100-80GB")
FAST = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODEL_STATES = (Kind.WEIGHTS, Kind.GRADIENTS, Kind.OPTIMIZER_STATES)

dense = st.sampled_from(DENSE)
moe = st.sampled_from(MOE)
methods = st.sampled_from(list(Method))
adapters = st.sampled_from([Method.LORA, Method.QLORA])
precisions = st.sampled_from([Precision.MIXED, Precision.BF16, Precision.AMP, Precision.FP32])
attns = st.sampled_from([AttnImplementation.SDPA, AttnImplementation.EAGER])
seqs = st.sampled_from([256, 512, 1024, 2048, 4096])
batches = st.integers(1, 4)
targets = st.sampled_from(["attention", "all-linear"])


def _training(method: Method, precision: Precision = Precision.MIXED, **kw) -> TrainingConfig:
    if method is Method.QLORA and precision in (Precision.FP32, Precision.AMP):
        precision = Precision.BF16  # QLoRA's base is NF4 under a 16-bit compute dtype
    return TrainingConfig(method=method, precision=precision, **kw)


def _states(est) -> int:
    return sum(t.bytes for t in est.per_device.terms if t.kind in MODEL_STATES)


# ---- the three figures ----


@FAST
@given(dense, methods, precisions, st.sampled_from(list(Recompute)), batches, seqs)
def test_the_three_figures_only_add_and_the_band_holds_the_estimate(model, method, precision, recompute, b, s):
    # README: "2. peak reserved — plus the caching allocator's slack"; "3. device used — plus memory
    # outside the allocator"; "Each figure carries a ± band".
    w = _training(method, precision, recompute=recompute, micro_batch_size=b, seq_len=s)
    rank = estimate(SPECS[model], w, H100).per_device
    assert rank.allocated_bytes <= rank.reserved_bytes <= rank.device_used_bytes
    assert rank.low_bytes <= rank.device_used_bytes <= rank.high_bytes


# ---- recompute ----


@FAST
@given(dense, methods, precisions, attns, batches, seqs, targets)
@example("meta-llama/Llama-3.1-8B", Method.LORA, Precision.MIXED, AttnImplementation.SDPA, 1, 256, "attention")
@example("meta-llama/Llama-3.1-8B", Method.QLORA, Precision.BF16, AttnImplementation.SDPA, 1, 256, "attention")
def test_selective_recompute_never_needs_more_than_none(model, method, precision, attn, b, s, lora_targets):
    # workload.Recompute.SELECTIVE: "Recompute the attention core (scores, softmax, dropout) in backward;
    # keep the rest" — it only drops tensors, so it never needs more than keeping everything. The first
    # example is issue 11's (18,391,311,360 > 18,387,116,032 B before the fix: the first layer's frozen
    # input under LoRA was counted under selective only; the trace of both is the same step).
    spec = SPECS[model]
    w = _training(method, precision, attn_implementation=attn, micro_batch_size=b, seq_len=s,
                  lora=LoraConfig(targets=lora_targets))
    none = estimate(spec, w, H100).per_device
    selective = estimate(spec, w.replace(recompute=Recompute.SELECTIVE), H100).per_device
    assert selective.allocated_bytes <= none.allocated_bytes
    assert selective.device_used_bytes <= none.device_used_bytes


@FAST
@given(dense, methods, precisions, attns, batches, st.sampled_from([1024, 2048, 4096, 8192]))
def test_full_recompute_never_stores_more_activations_than_selective(model, method, precision, attn, b, s):
    # workload.Recompute.FULL: "Keep only each layer's input; rebuild one layer's activations at a time in
    # backward": what is kept through the step (the checkpoints, or every layer's tensors) is never
    # more than selective's, which keeps every layer's tensors but eager attention's s x s ones. (The
    # peak itself can be higher under full at short sequences, where one rebuilt layer and its backward
    # outweigh what the checkpoints save, so the property is on the stored term.)
    spec = SPECS[model]
    w = _training(method, precision, attn_implementation=attn, micro_batch_size=b, seq_len=s)

    def stored(r: Recompute) -> int:
        terms = estimate(spec, w.replace(recompute=r), H100).per_device.terms
        return sum(t.bytes for t in terms if t.name in ("activations.layers", "activations.checkpoints"))

    assert stored(Recompute.FULL) <= stored(Recompute.SELECTIVE)


# ---- LoRA against full fine-tuning ----


@FAST
@given(dense, adapters, precisions, batches, seqs, targets, st.sampled_from([8, 16, 64]))
def test_lora_never_needs_more_model_states_than_full_fine_tuning(model, method, precision, b, s, lora_targets,
                                                                  rank):
    # `memest hf meta-llama/Llama-2-7b-hf --train --precision mixed --framework deepspeed --gpu A100-80GB`:
    # "Cheapest fit: --finetune lora → 29.28 GiB per device" (the search's method change) rests on
    # LoRA/QLoRA freezing the base: "LoRA adapters ... trained with the optimizer's full states" only on
    # the adapters. Weights + gradients + optimizer states never exceed full fine-tuning's; activations
    # can (PEFT's fp32 input copies: the next test).
    spec = SPECS[model]
    full = _training(Method.FULL, precision, micro_batch_size=b, seq_len=s)
    lora = _training(method, precision, micro_batch_size=b, seq_len=s, lora=LoraConfig(rank=rank, targets=lora_targets))
    assert _states(estimate(spec, lora, H100)) <= _states(estimate(spec, full, H100))


def test_lora_above_full_fine_tuning_says_why():
    # issue 11: Llama-3.1-8B, all-linear, micro-batch 4, seq_len 8192: LoRA 377.0 GB vs full 374.6 GB
    # peak allocated, and the meta-device trace of transformers + PEFT agrees (351.16 vs 348.84 GiB
    # traced peak allocated; `memest hf ... --trace`, activations 288.57 vs 197.14 GiB). Why, per token
    # and layer: each of the 7 adapted linears keeps its own fp32 copy of its input (q, k, v, gate, up
    # 4h each, o 4·a·d = 4h, down 4i): 4·(6·4096 + 14,336) = 155,648 B, where full fine-tuning keeps
    # the two norms' 16-bit outputs, shared by their readers, their normalized values and the MLP
    # product: 2·(2h) + 2·(2h) + 2i = 61,440 B. 94,208 B more x 32 layers x 32,768 tokens = 98.8e9 B,
    # above the fp32 master and Adam states the frozen base saves at the peak (12 B x 8.03e9 parameters
    # = 96.4e9 B, less the adapters' 0.5e9). The report must say so; the
    # same job at seq_len 1024 needs less than full fine-tuning and says nothing.
    spec = SPECS["meta-llama/Llama-3.1-8B"]
    long = _training(Method.LORA, micro_batch_size=4, seq_len=8192, lora=LoraConfig(targets="all-linear"))
    full = long.replace(method=Method.FULL)
    assert (estimate(spec, long, H100).per_device.allocated_bytes
            > estimate(spec, full, H100).per_device.allocated_bytes)
    notes = assess(spec, long, H100, search=False).notes
    assert any("more memory than full fine-tuning" in n and "its own copy of its input" in n for n in notes), notes
    short = long.replace(seq_len=1024)
    assert not any("full fine-tuning" in n for n in assess(spec, short, H100, search=False).notes)


@FAST
@given(dense, batches, seqs)
def test_kbit_preparation_none_never_needs_more_than_trl(model, b, s):
    # README: "`none` leaves every non-quantized weight and the residual stream at 16 bits (half trl's
    # layer checkpoints ...)".
    spec = SPECS[model]
    w = _training(Method.QLORA, Precision.BF16, micro_batch_size=b, seq_len=s, recompute=Recompute.FULL)
    trl = estimate(spec, w.replace(prepare_kbit_training=KbitPrep.TRL), H100).per_device
    none = estimate(spec, w.replace(prepare_kbit_training=KbitPrep.NONE), H100).per_device
    assert none.allocated_bytes <= trl.allocated_bytes


# ---- sharding ----


@FAST
@given(moe, methods, st.sampled_from([1, 2, 4, 8]), st.sampled_from([0, 1, 2, 3]))
def test_more_expert_parallelism_never_raises_model_states(model, method, ep, zero):
    # README: "Expert parallelism (`--ep`) divides the expert weights and their gradients and optimizer
    # states over the expert-parallel ranks".
    spec = SPECS[model]
    par = Parallelism(dp=8, ep=ep, zero_stage=zero)
    w = _training(method, micro_batch_size=1, seq_len=512, parallelism=par)
    doubled = w.replace(parallelism=Parallelism(dp=8, ep=min(2 * ep, 8), zero_stage=zero))
    assert _states(estimate(spec, doubled, H100)) <= _states(estimate(spec, w, H100))


@FAST
@given(dense, methods, st.sampled_from([2, 4, 8, 16, 32]), st.sampled_from([Precision.FSDP2, Precision.MIXED]))
def test_more_devices_under_full_sharding_never_raise_model_states(model, method, dp, precision):
    # README (planning): the search holds "ZeRO" and "DP" as knobs that trade memory for devices; under
    # ZeRO-3 / FSDP full sharding every model state is divided over the dp ranks, so more of them never
    # raise a device's weights, gradients and optimizer states.
    spec = SPECS[model]
    w = _training(method, precision, seq_len=512, parallelism=Parallelism(dp=dp, zero_stage=3))
    more = w.replace(parallelism=Parallelism(dp=2 * dp, zero_stage=3))
    assert _states(estimate(spec, more, H100)) <= _states(estimate(spec, w, H100))


@FAST
@given(dense, methods, st.sampled_from([2, 3]), st.sampled_from([1, 4, 8]), seqs)
def test_cpu_offload_never_raises_device_memory(model, method, zero, dp, s):
    # README: the planner tries "CPU offload only with --allow-offload" as a way to fit; workload.Offload:
    # "Optimizer states (and fp32 master) in host RAM", "Optimizer states and parameters in host RAM
    # (ZeRO-3 / FSDP only)" — each moves more off the device.
    spec = SPECS[model]
    w = _training(method, seq_len=s, parallelism=Parallelism(dp=dp, zero_stage=zero))
    used = {o: estimate(spec, w.replace(offload=o), H100).per_device.device_used_bytes
            for o in (Offload.NONE, Offload.OPTIMIZER, *([Offload.PARAMS] if zero == 3 else []))}
    assert used[Offload.OPTIMIZER] <= used[Offload.NONE]
    assert used.get(Offload.PARAMS, 0) <= used[Offload.OPTIMIZER]


# ---- serving ----

SERVE = ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", "mistralai/Mixtral-8x7B-v0.1"]
serve_models = st.sampled_from(SERVE)
engines = st.sampled_from([Engine.VLLM, Engine.HF])
lengths = st.sampled_from([512, 1024, 2048, 4096, 8192])


def _needed(spec, s: ServingConfig, device=H100) -> int:
    est = estimate(spec, s, device)
    if s.engine is Engine.VLLM:
        # what the job asks of the engine: its own memory (non-KV) plus batch_size requests' KV cache
        summary = est.serving
        return summary.non_kv_bytes + s.batch_size * summary.request_kv_bytes
    return verdict(est, device, s.parallelism.world_size, 0.10).needed_bytes


@FAST
@given(serve_models, engines, lengths, st.integers(1, 16))
def test_longer_context_or_more_sequences_never_need_less(model, engine, length, batch):
    # README: "the largest micro-batch / sequence (serving: concurrency / context) that still fits, found
    # by bisection over the estimator" — bisection needs the need to grow with context and concurrency.
    spec = SPECS[model]
    s = ServingConfig(engine=engine, max_model_len=length, batch_size=batch)
    base = _needed(spec, s)
    assert _needed(spec, ServingConfig(engine=engine, max_model_len=2 * length, batch_size=batch)) >= base
    assert _needed(spec, ServingConfig(engine=engine, max_model_len=length, batch_size=batch + 1)) >= base


@FAST
@given(serve_models, engines, st.sampled_from([("none", "int8"), ("int8", "int4"), ("none", "fp8"), ("none", "int4"),
                                               ("none", "nf4")]))
def test_fewer_weight_bits_never_raise_weight_bytes(model, engine, pair):
    # README: "quantized weights and an fp8 KV cache only with --allow-quantization" — the planner offers
    # quantization as a way to fit, so fewer bits never store more weight bytes.
    spec = SPECS[model]
    wider, narrower = pair
    if engine is Engine.VLLM and narrower == "nf4":
        narrower = "int4"

    def weights(q: str) -> int:
        est = estimate(spec, ServingConfig(engine=engine, max_model_len=2048, quantization=q), H100)
        return sum(t.bytes for t in est.per_device.terms if t.kind is Kind.WEIGHTS)

    assert weights(narrower) <= weights(wider)


@FAST
@given(serve_models, engines, lengths, st.integers(1, 8))
def test_an_fp8_kv_cache_never_needs_more(model, engine, length, batch):
    # README: "`--kv-cache-dtype auto|fp8`", offered by the planner with --allow-quantization to fit.
    spec = SPECS[model]
    auto = ServingConfig(engine=engine, max_model_len=length, batch_size=batch)
    fp8 = ServingConfig(engine=engine, max_model_len=length, batch_size=batch, kv_cache_dtype="fp8")
    assert _needed(spec, fp8) <= _needed(spec, auto)


@FAST
@given(st.sampled_from(["meta-llama/Llama-3.1-8B", "mistralai/Mixtral-8x7B-v0.1"]), st.sampled_from([1, 2, 4]))
def test_more_tensor_parallelism_never_raises_a_devices_weights(model, tp):
    # README: "Serving runs `--gpus` = tp x pp x dp devices" and the planner searches "TP (within a node,
    # dividing the heads)": tp splits the weights (vLLM; --engine hf models one device).
    spec = SPECS[model]

    def weights(t: int) -> int:
        s = ServingConfig(max_model_len=2048, parallelism=Parallelism(tp=t))
        return sum(x.bytes for x in estimate(spec, s, H100).per_device.terms if x.kind is Kind.WEIGHTS)

    assert weights(2 * tp) <= weights(tp)


@FAST
@given(serve_models, st.sampled_from([0.5, 0.6, 0.7, 0.8, 0.85]))
def test_a_higher_gpu_memory_utilization_never_holds_less(model, utilization):
    # README: "for a vLLM job that only exceeds the device, the largest lower `--gpu-memory-utilization`
    # that fits is one of the candidates" — found by bisection, so what the engine holds grows with it.
    spec = SPECS[model]

    def held(u: float) -> int:
        s = ServingConfig(max_model_len=2048, gpu_memory_utilization=u)
        return verdict(estimate(spec, s, H100), H100, 1, 0.10).needed_bytes

    assert held(utilization + 0.1) >= held(utilization)
