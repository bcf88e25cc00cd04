"""The trace against a real run: a tiny model trained (and served) for real on the CPU, measured with
``torch.profiler``'s memory timeline, and the trace of the same step with ``target="cpu"``.

The real step is written out here, independently of memest's step code, the way a training
script runs it: AdamW (foreach) states created by a first step, then one step measured — forward
with the loss inside the model, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``.
The profiler's timeline (``MemoryProfileTimeline``) counts every CPU tensor, those that existed
before profiling (parameters, optimizer states) included; its peak is compared with the trace's
peak of tensor bytes. Tolerance: 2%.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trace_models import tiny_config

from memest.trace import trace
from memest.workload import Engine, LoraConfig, Method, Precision, Recompute, ServingConfig, TrainingConfig

TOLERANCE = 0.02
"""Relative difference allowed between the measured and the traced peak."""

B, S = 2, 256


def _profiled_peak(run) -> int:
    """Peak bytes of CPU tensors over ``run()``, from the profiler's memory timeline."""
    import numpy as np
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        run()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return int(np.asarray(sizes).sum(axis=1).max())


def _real_model(w: TrainingConfig | ServingConfig, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = dict(tiny_config("llama").raw)
    raw.pop("model_type")
    config = AutoConfig.for_model("llama", **raw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    if isinstance(w, TrainingConfig) and w.method is Method.LORA:
        from peft import LoraConfig as PeftLora
        from peft import get_peft_model

        model = get_peft_model(model, PeftLora(r=w.lora.rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                               task_type="CAUSAL_LM"))
    if isinstance(w, TrainingConfig) and w.recompute is Recompute.FULL:
        model.activation_checkpointing_enable()
    return model


def _measure_training(w: TrainingConfig, dtype: torch.dtype) -> int:
    model = _real_model(w, dtype)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, foreach=True)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)

    def step() -> None:
        ids = torch.zeros((B, S), dtype=torch.long)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _profiled_peak(step)


def _measure_serving(w: ServingConfig, dtype: torch.dtype) -> int:
    from transformers import DynamicCache

    model = _real_model(w, dtype)
    model.eval()

    @torch.no_grad()
    def generate() -> None:
        cache = DynamicCache(config=model.config)
        ids = torch.zeros((w.batch_size, w.max_model_len - 2), dtype=torch.long)
        for _ in range(3):  # prefill + 2 decode steps
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
            del out
            ids = torch.argmax(logits, dim=-1)[:, None]

    return _profiled_peak(generate)


CASES = [
    ("fp32-full", TrainingConfig(micro_batch_size=B, seq_len=S, precision=Precision.FP32), torch.float32),
    ("fp32-full-recompute", TrainingConfig(micro_batch_size=B, seq_len=S, precision=Precision.FP32,
                                           recompute=Recompute.FULL), torch.float32),
    ("bf16-full", TrainingConfig(micro_batch_size=B, seq_len=S, precision=Precision.BF16), torch.bfloat16),
    ("fp32-lora", TrainingConfig(micro_batch_size=B, seq_len=S, precision=Precision.FP32, method=Method.LORA,
                                 lora=LoraConfig(rank=16, targets="attention")), torch.float32),
    ("fp32-serve", ServingConfig(engine=Engine.HF, dtype="fp32", max_model_len=S, batch_size=B), torch.float32),
]


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "dtype"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_trace_matches_a_real_cpu_run(workload, dtype) -> None:
    if isinstance(workload, TrainingConfig):
        measured = _measure_training(workload, dtype)
    else:
        measured = _measure_serving(workload, dtype)
    traced = trace(tiny_config("llama"), workload, target="cpu").per_device.peak_allocated_bytes
    print(f"traced {traced:,} B, measured {measured:,} B ({(traced - measured) / measured:+.4%})")
    assert abs(traced - measured) <= TOLERANCE * measured, f"traced {traced:,} B vs measured {measured:,} B"
