"""vLLM's start-up memory budget, version by version: what it profiles and what it leaves for KV.

:func:`engine_settings` gives a version's defaults, :func:`profile_peak` the profiling forward's
peak, :func:`non_torch_bytes` the measured non-torch memory, :func:`budget` what the KV cache gets
of the engine's share and :func:`outside_budget_bytes` what sits outside it (CUDA graphs, and for
0.19 the context and NCCL). The arithmetic of each version (0.19, 0.6, 0.6.4, 0.2) and the cases its
constants are fitted to: DESIGN.md, "vLLM's start-up budget". 0.6.4 is 0.6's V0 worker with the
non-torch memory of 0.6.4's ``determine_num_available_blocks`` (:data:`V064`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memest.devices import CUSTOM, Device, GiB
from memest.errors import InputError
from memest.estimate import runtime
from memest.spec import Component, LayerSpec, ModelSpec
from memest.workload import ENGINE_VERSIONS

VLLM_VERSIONS = ENGINE_VERSIONS["vllm"]
"""Versions whose budget arithmetic memest models (``--engine-version``); the first is the default."""
DEFAULT_VLLM_VERSION = VLLM_VERSIONS[0]

DENSE_HIDDEN_COEFFICIENT = 3.25
"""h-sized buffers alive at the MLP of the profiling forward besides the MLP intermediates (hidden
states, residual, normed input, output), per token. Fitted: vllm019_llama31_8b_pp2 gives 3.09
(1.10 GiB, stage 0, no sampler), vllm019_llama31_8b_fp32 gives 3.42 (2.21 GiB in fp32)."""

V0_SAMPLER_BYTES_PER_LOGIT = 36
"""fp32/int64 buffers per logit of V0's sampler beyond the logits themselves (sort values and
indices, inverse permutation, softmax, log-softmax, noise). Fitted to case
vllm065dev_llama3_8b_h100_tp1_tp2 (activation peak 1.26 GiB at both tp=1 and tp=2, so set by the
TP-invariant sampler)."""

NON_TORCH_INCREASE: dict[str, dict[int, int]] = {
    "0.19": {1: round(0.25 * GiB), 2: round(2.07 * GiB), 4: round(2.13 * GiB)},
    "0.6": {1: round(1.79 * GiB), 2: round(3.58 * GiB)},
    "0.2": {1: round(0.77 * GiB), 4: round(13.12 * GiB)},
}
"""Non-torch memory per rank that the budget subtracts, by version and tp (H100/A100, CUDA 12).

0.19: what the profiling forward adds ('non-torch forward increase memory'): 0.25 GiB at tp=1
(cases vllm019_llama31_8b_tp1, 0.24-0.26 over five models), 2.07-2.09 GiB at tp=2 (llama, qwen
72B, mixtral), 2.13 GiB at tp=4; larger tp uses the tp=4 value. A pipeline stage that is not the
last one adds only 0.07 GiB (vllm019_llama31_8b_pp2): :data:`NON_TORCH_PP_FIRST`.
0.6: all non-torch memory since before start-up, CUDA context included: 1.79 GiB at tp=1, 3.58
GiB at tp=2 (vllm065dev_llama3_8b_h100_tp1_tp2); larger tp uses the tp=2 value.
0.2: (total - free) after profiling minus the torch peak: 0.77 GiB for Llama-2-7B at tp=1, 13.12
GiB at tp=4 (NCCL + cupy buffers of that era), from the block counts before and after PR #2031
(vllm_pr2031_llama2_a100_blocks)."""

V064 = "0.6.4"
"""The V0 version whose non-torch memory is measured device-wide after the profile run (vllm/worker/worker.py
``determine_num_available_blocks`` at v0.6.4: ``non_torch_allocations = (total - free) -
allocated_bytes.all.current``, after ``torch.cuda.empty_cache()``): the process's CUDA context, the NCCL
communicators at tp > 1, and whatever other processes hold on the device. memest has no setting for memory
other processes hold, so it takes the device as otherwise empty."""

V0_HIDDEN_BUFFERS = 3
"""h-sized tensors alive at the MLP of a V0 (0.6, 0.6.4) eager decoder layer, per token: the previous layer's
output (held by ``LlamaModel.forward``'s loop variable while ``layer(...)`` runs), the attention output
(normed in place by ``fused_add_rms_norm``) and the residual (updated in place). vllm/model_executor/models/
llama.py at v0.6.4, ``LlamaModel.forward`` / ``LlamaDecoderLayer.forward``; the Llama-style model files
(Qwen2, Mistral) have the same structure, others may keep one more (GPT-2's block holds ``attn_output``)."""

NON_TORCH_PP_FIRST = round(0.07 * GiB)
"""0.19, a pipeline stage that is not the last (no sampler, p2p instead of all-reduce)."""

CUDA_GRAPH_BASE_BYTES = round(0.39 * GiB)
CUDA_GRAPH_PER_LAYER_BYTES = round(0.01625 * GiB)
"""vLLM 0.19's CUDA-graph pool (captured after the KV cache, outside the budget), per device, as
base + per layer of the stage: 51 capture sizes x the layers' kernel nodes. Fitted to Llama-3.1-8B
on an H100: 0.91 GiB with 32 layers (vllm019_llama31_8b_tp1), 0.65 GiB with 16 layers per stage
(vllm019_llama31_8b_pp2) -> 16.6 MiB per layer + 0.39 GiB. Against the other 0.19 cases: Qwen2.5-7B
28 layers 0.845 vs 0.87 GiB, Qwen2.5-72B 80 layers 1.69 vs 1.61, Mixtral 32 layers 0.91 vs 0.93,
Llama tp=2/tp=4 0.91 vs 0.76/0.67 (tensor parallelism shrinks it), DeepSeek-V2-Lite (MLA) 0.83 vs
1.57 — the spread the band's runtime uncertainty covers."""


GRAPH_VENDORS = frozenset({"nvidia", "amd", CUSTOM})
"""Where vLLM captures a graph pool: CUDA graphs on NVIDIA, HIP graphs on ROCm, and a custom size, taken
as a CUDA device (its runtime constants are the generic CUDA ones). Not on a TPU (XLA compiles), an AWS
Neuron chip (Trainium, Inferentia: neuronx compiles the model ahead of time), a Gaudi or Intel GPU, or
Apple's Metal: none of them has CUDA graphs."""


def cuda_alike(device: Device) -> bool:
    """vLLM runs ``device`` as a CUDA device (``DeviceConfig.device_type == "cuda"``, ROCm included):
    a GPU of :data:`GRAPH_VENDORS`."""
    return device.vendor in GRAPH_VENDORS and device.kind != "cpu"


def cuda_graph_bytes(device: Device, num_layers: int, *, enforce_eager: bool) -> int:
    """CUDA-graph pool of a vLLM rank whose stage has ``num_layers`` layers (see the constants): none
    with ``--enforce-eager`` or on devices without CUDA / HIP graphs (:data:`GRAPH_VENDORS`)."""
    if enforce_eager or not cuda_alike(device):
        return 0
    return CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_PER_LAYER_BYTES * num_layers


NUM_SMS: dict[str, int] = {"hopper": 132, "blackwell": 148, "ampere": 108, "ada": 128, "turing": 40, "volta": 80}
"""Streaming multiprocessors by architecture (H100 SXM 132, B200 148, A100 108), which size the
Triton top-k/top-p buffer (one vocabulary row per program)."""

MLA_PREFILL_WORKSPACE_CAP = 64 * 1024
"""vLLM ``determine_chunked_prefill_workspace_size``: at most 64k tokens."""


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The vLLM scheduler settings that size the profiling run.

    Attributes:
        max_num_batched_tokens: Tokens in the profiling forward (T).
        max_num_seqs: Requests whose logits the sampler profiles (N = min(max_num_seqs, T)).
    """

    max_num_batched_tokens: int
    max_num_seqs: int


def check_version(version: str) -> str:
    """The version, checked.

    Raises:
        InputError: not a modelled version.
    """
    if version not in VLLM_VERSIONS:
        raise InputError(f"{{engine_version}} {version!r} is not a vLLM version memest models; use one of "
                         f"{', '.join(VLLM_VERSIONS)}", field="engine_version")
    return version


V0_LONG_CONTEXT = 32768
"""V0 (0.6, 0.6.4) turns chunked prefill on by itself when ``max_model_len`` exceeds this (vllm/engine/arg_utils.py
``EngineArgs.create_engine_config`` at v0.6.4 - v0.6.6: ``use_long_context = max_model_len > 32768``)."""

V0_CHUNKED_PREFILL_TOKENS = 512
"""V0's ``max_num_batched_tokens`` when chunked prefill is on and the user gave none (vllm/config.py
``SchedulerConfig.__init__`` at v0.6.x: "the values that have the best balance between ITL and TTFT on A100")."""

V0_DEFAULT_TOKENS = 2048
"""V0's floor without chunked prefill: ``max(max_model_len, 2048)`` (``SchedulerConfig.__init__`` at v0.6.x)."""

V0_MULTIMODAL_TOKENS = 5120
"""V0's floor for a multimodal model: ``max(max_num_batched_tokens, _MULTIMODAL_MODEL_MAX_NUM_BATCHED_TOKENS)``
(vllm/config.py at v0.6.x: 5120), whether chunked prefill is on or not."""


def is_multimodal(spec: ModelSpec) -> bool:
    """The checkpoint carries a vision / audio tower (component ``other`` before the first layer): what vLLM's
    ``ModelConfig.is_multimodal_model`` says of its architecture."""
    return any(t.component is Component.OTHER for t in spec.embedding)


def v0_chunked_prefill(version: str, spec: ModelSpec, device: Device, max_model_len: int) -> bool:
    """Whether V0 (0.6, 0.6.4) enables chunked prefill by default for ``vllm serve`` (memest has no
    ``--enable-chunked-prefill`` setting, so vLLM decides). vllm/engine/arg_utils.py
    ``EngineArgs.create_engine_config`` at v0.6.4 - v0.6.6: on when ``max_model_len > 32768``, the model is not
    multimodal, the device is CUDA-like (ROCm included), the config has no sliding window
    (``model_config.get_sliding_window() is None``) and neither speculative decoding, LoRA nor prompt adapters are
    on (memest models none of them); 0.6.5 - 0.6.6 (memest's ``0.6``) also leave it off for embedding models
    (``model_config.task != "embedding"``), memest's ``masked_lm`` / ``classification`` heads. Off for 0.2 (its
    default was off) and not asked for 0.19 (V1 always chunks)."""
    if version not in ("0.6", V064) or max_model_len <= V0_LONG_CONTEXT:
        return False
    if is_multimodal(spec) or not cuda_alike(device):
        return False
    if any(layer.attention.sliding_window is not None for layer in spec.layers):
        return False
    return not (version == "0.6" and spec.task not in ("causal_lm", "seq2seq"))


def engine_settings(version: str, device: Device, max_model_len: int, max_num_batched_tokens: int | None,
                    max_num_seqs: int | None, *, spec: ModelSpec) -> EngineSettings:
    """vLLM's defaults for ``vllm serve`` where the user gave none (a given ``max_num_batched_tokens`` or
    ``max_num_seqs`` is kept as given).

    0.19 (``EngineArgs.get_batch_defaults``, chunked prefill on): 8192 tokens / 1024 sequences on
    devices of 70 GiB or more except A100s, else 2048 / 256; T is capped at
    max_num_seqs x max_model_len and N at T. 0.6 / 0.6.4 (``SchedulerConfig.__init__`` at v0.6.x): T = 512 when
    chunked prefill is on (:func:`v0_chunked_prefill`: max_model_len > 32768), else max(max_model_len, 2048),
    and at least 5120 for a multimodal model; N = 256. 0.2 (chunked prefill off): T = max(max_model_len, 2048),
    N = 256.
    """
    if version == "0.19":
        big = device.memory_bytes >= 70 * GiB and not device.name.lower().startswith("a100")
        seqs = max_num_seqs if max_num_seqs is not None else (1024 if big else 256)
        if max_num_batched_tokens is None:
            tokens = min(8192 if big else 2048, seqs * max_model_len)
        else:
            tokens = max_num_batched_tokens
        return EngineSettings(tokens, min(seqs, tokens) if max_num_seqs is None else seqs)
    seqs = max_num_seqs if max_num_seqs is not None else 256
    if max_num_batched_tokens is not None:
        return EngineSettings(max_num_batched_tokens, seqs)
    if v0_chunked_prefill(version, spec, device, max_model_len):
        tokens = V0_CHUNKED_PREFILL_TOKENS
    else:
        tokens = max(max_model_len, V0_DEFAULT_TOKENS)
    if version in ("0.6", V064) and is_multimodal(spec):
        tokens = max(tokens, V0_MULTIMODAL_TOKENS)
    return EngineSettings(tokens, seqs)


@dataclass(frozen=True, slots=True)
class ProfilePeak:
    """What the profiling run adds to torch's peak allocated bytes on one rank.

    Attributes:
        forward: Transient peak of the forward pass (largest layer).
        sampler: Transient peak of the sampler (0 on stages without the head).
        persistent: Buffers the run allocates and keeps (MoE workspaces).
        workspace: The cuBLAS workspace allocated by the first matmul.
    """

    forward: int
    sampler: int
    persistent: int
    workspace: int

    @property
    def total(self) -> int:
        """The torch peak increase: persistent + workspace + the larger transient."""
        return self.persistent + self.workspace + max(self.forward, self.sampler)


def _mlp_width(layer: LayerSpec, tp: int) -> float:
    mlp = layer.mlp
    factor = 4 if mlp.gated else 3
    return factor * mlp.intermediate_size / tp


def _v0_mlp_width(layer: LayerSpec, tp: int) -> float:
    """Elements per token alive in a V0 eager MLP (vllm/model_executor/models/llama.py ``LlamaMLP`` at v0.6.4):
    gated, ``gate_up_proj``'s 2 I / tp output and ``SiluAndMul``'s I / tp output (``torch.empty`` then
    ``ops.silu_and_mul``) live together; ungated, ``fc1``'s I / tp output and the activation's."""
    return (3 if layer.mlp.gated else 2) * layer.mlp.intermediate_size / tp


def profile_peak(spec: ModelSpec, layers: tuple[tuple[LayerSpec, int], ...], *, last: bool, tp: int, c: float,
                 settings: EngineSettings, max_model_len: int, block_size: int, version: str,
                 device: Device) -> ProfilePeak:
    """The torch peak increase of vLLM's profiling run on one rank (see the module docstring).

    Args:
        spec: The model.
        layers: The rank's distinct layers with counts.
        last: True on the last pipeline stage (it runs the sampler).
        tp: Tensor-parallel degree.
        c: Bytes per activation element (the compute dtype; 2 for fp8/int weights).
        settings: max_num_batched_tokens and max_num_seqs.
        max_model_len: For MLA's profile-only workspace.
        block_size: For MLA's profile-only workspace.
        version: The vLLM version.
        device: For the cuBLAS workspace and the SM count.
    """
    h = spec.hidden_size
    T = settings.max_num_batched_tokens
    forward = 0.0
    persistent = 0.0
    for layer, _ in layers:
        mlp = layer.mlp
        per_token = DENSE_HIDDEN_COEFFICIENT * h
        if mlp.is_moe:
            ws = mlp.num_experts_per_tok * (max(mlp.intermediate_size / tp, h) + max(2 * mlp.intermediate_size / tp, h))
            if version == "0.19":
                persistent = max(persistent, ws * T * c)
            else:
                per_token += ws
            if mlp.num_shared_experts:
                per_token += (4 if mlp.gated else 3) * mlp.shared_intermediate_size / tp
        elif version in ("0.6", V064):
            per_token = V0_HIDDEN_BUFFERS * h + _v0_mlp_width(layer, tp)
        else:
            per_token += _mlp_width(layer, tp)
        transient = per_token * T * c
        a = layer.attention
        if version == "0.19" and a.kind == "mla":
            size = min(max(8 * max_model_len, 4 * settings.max_num_seqs * block_size), MLA_PREFILL_WORKSPACE_CAP)
            size = max(size, settings.max_num_seqs * block_size)
            qk_nope = a.head_dim - a.qk_rope_head_dim
            transient += size * (a.num_heads // tp) * (qk_nope + a.v_head_dim) * c
        forward = max(forward, transient)
    sampler = 0.0
    if last and spec.task in ("causal_lm", "seq2seq"):
        V = spec.vocab_size
        N = min(settings.max_num_seqs, T)
        if version == "0.19":
            sms = NUM_SMS.get(device.arch, 132)
            buffer = min(sms, N) * V * 4 if N >= 8 else 0
            model_dtype_logits = N * V * c if c != 4 else 0
            sampler = T * h * c + 2 * N * h * c + model_dtype_logits + 3 * N * V * 4 + buffer
        else:
            sampler = T * h * c + N * V * (c + V0_SAMPLER_BYTES_PER_LOGIT)
    return ProfilePeak(
        forward=math.ceil(forward),
        sampler=math.ceil(sampler),
        persistent=math.ceil(persistent),
        workspace=runtime.cublas_workspace_bytes(device),
    )


def non_torch_bytes(version: str, tp: int, *, last: bool, pp: int, device: Device) -> int:
    """Non-torch memory the budget subtracts on one rank: :data:`NON_TORCH_INCREASE`, or for 0.6.4
    (:data:`V064`) the CUDA context of ``device`` plus NCCL's buffers for a job of tp x pp devices."""
    if version == V064:
        return runtime.cuda_context_bytes(device) + runtime.nccl_bytes(tp * pp, device)
    table = NON_TORCH_INCREASE[version]
    if version == "0.19" and pp > 1 and not last and tp == 1:
        return NON_TORCH_PP_FIRST
    known = [t for t in sorted(table) if t <= tp]
    return table[known[-1]] if known else table[min(table)]


@dataclass(frozen=True, slots=True)
class Budget:
    """vLLM's start-up arithmetic on one rank (bytes).

    Attributes:
        requested: gpu_memory_utilization x capacity (what vLLM may use).
        weights: The loaded weights ('Model loading took').
        activation: The profiled torch peak increase.
        non_torch: Non-torch memory subtracted.
        available: What is left for the KV cache ('Available KV cache memory'); may be negative.
    """

    requested: int
    weights: int
    activation: int
    non_torch: int

    @property
    def non_kv(self) -> int:
        """'Total non KV cache memory'."""
        return self.weights + self.activation + self.non_torch

    @property
    def available(self) -> int:
        """Bytes left for KV blocks."""
        return self.requested - self.non_kv


def budget(version: str, device: Device, gpu_memory_utilization: float, weights: int, activation: int,
           non_torch: int) -> Budget:
    """vLLM's KV budget on one rank (see the module docstring for each version's formula)."""
    if version == "0.19":
        requested = math.ceil(device.memory_bytes * gpu_memory_utilization)
    else:
        requested = math.floor(device.memory_bytes * gpu_memory_utilization)
    return Budget(requested, weights, activation, non_torch)


def outside_budget_bytes(version: str, device: Device, num_layers: int, *, enforce_eager: bool, world_size: int) -> int:
    """What a vLLM process holds on one device beyond gpu_memory_utilization x capacity: the CUDA
    graphs captured after the KV cache (:func:`cuda_graph_bytes`) for a stage of ``num_layers``
    layers, and for 0.19, whose budget starts after them (see the module docstring), the CUDA context
    and the NCCL communicators of a job of ``world_size`` devices."""
    out = cuda_graph_bytes(device, num_layers, enforce_eager=enforce_eager)
    if version == "0.19":
        out += runtime.cuda_context_bytes(device) + runtime.nccl_bytes(world_size, device)
    return out
