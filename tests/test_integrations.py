"""memest.integrations for real on the CPU: the HF Trainer with MemestCallback (a tiny Llama, full and PEFT LoRA),
memest.track around a plain loop, and what they do with bad input (the run goes on).

The model is tests/cpu_measure.py's tiny Llama with h 128, i 384, 3 layers, 4 heads / 2 KV heads of 32,
V 300, untied lm_head (as tests/test_training_cpu_measured.py), so every state is counted by hand:

    embed 300 x 128 = 38,400; per layer q 128x128 16,384 + k, v 128x64 8,192 each + o 16,384
    + gate/up/down 3 x 128 x 384 147,456 + two norms 256 = 196,864, x 3 = 590,592; final norm 128;
    lm_head 38,400: P = 667,520 parameters, 30 tensors (1 + 3 x 9 + 1 + 1).

The measured peak must be within TOLERANCE of the estimate: the 10% ``memest calibrate`` meets on the CPU
(tests/test_calibrate_cpu.py).
"""

from __future__ import annotations

import json

import pytest

from memest.errors import InputError

TOLERANCE = 0.10
"""Predicted peak allocated within 10% of measured, as tests/test_calibrate_cpu.py."""
P = 38_400 + 3 * 196_864 + 128 + 38_400
TENSORS = 1 + 3 * 9 + 1 + 1
TINY = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 300}
BATCH, SEQ = 4, 128


def test_read_data_reads_training_arguments_as_the_recipe_reader():
    """A TrainingArguments dict in memory reads as the same keys in a recipe file: per_device_train_batch_size
    -> micro_batch_size, gradient_accumulation_steps -> grad_accum_steps, bf16 over fp32 parameters -> amp,
    adamw_torch_fused -> adamw_fused, gradient_checkpointing -> full recompute; an inline DeepSpeed config's
    ZeRO stage 2 and bf16 -> deepspeed's mixed precision (memest.workload.files.trainer, deepspeed)."""
    from memest.workload import Framework, Optimizer, Precision, Recompute
    from memest.workload.files import read_data

    r = read_data({"output_dir": "out", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4,
                   "bf16": True, "fp16": False, "optim": "adamw_torch_fused", "gradient_checkpointing": True},
                  "TrainingArguments")
    v = r.values
    assert (v["micro_batch_size"], v["grad_accum_steps"]) == (8, 4)
    assert v["precision"] is Precision.AMP and v["optimizer"] is Optimizer.ADAMW_FUSED
    assert Recompute(v["recompute"]) is Recompute.FULL
    assert r.origins["micro_batch_size"] == "TrainingArguments per_device_train_batch_size"
    ds = read_data({"output_dir": "out", "bf16": True, "deepspeed": {"zero_optimization": {"stage": 2},
                                                                      "bf16": {"enabled": True}}}, "TrainingArguments")
    assert ds.values["zero_stage"] == 2 and ds.values["framework"] is Framework.DEEPSPEED
    assert ds.values["precision"] is Precision.MIXED


def test_watch_refuses_a_bad_steps_value():
    from memest.integrations._job import Watch

    with pytest.raises(InputError, match=r"steps 0: measure at least 1"):
        Watch(steps=0, record=False, results_path=None, log=None, warn=None, origin="test", settings={})


# ---- for real ----


def _model(lora: list[str] | None = None):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from cpu_measure import tiny_llama_config
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = tiny_llama_config(**TINY)
    torch.manual_seed(0)
    config = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules=lora, lora_dropout=0.0))
    return model


def _dataset():
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> dict:
            ids = torch.randint(0, TINY["vocab_size"], (SEQ,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    return Tokens()


def _train(tmp_path, model, callback, *, steps: int = 3, **args):
    from transformers import Trainer, TrainingArguments

    targs = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, max_steps=steps,
                              use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                              disable_tqdm=True, dataloader_num_workers=0, **args)
    trainer = Trainer(model=model, args=targs, train_dataset=_dataset(), callbacks=[callback])
    return trainer.train()


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_hf_trainer_full_fine_tune_measured_against_the_estimate(tmp_path):
    """fp32 AdamW (optim adamw_torch) full fine-tune, 3 optimizer steps: the job is read (micro-batch 4, 128
    tokens from the first forward, fp32, adamw, stack hf-trainer), steps 2 and 3 are profiled, and the
    record holds the real run's figures: the weights P x 4 B, AdamW's exp_avg + exp_avg_sq 2 x P x 4 B plus one
    4-byte step counter per tensor (the fp32 ``step`` of torch AdamW), two step peaks; the peak within 10%."""
    from memest.integrations.hf import MemestCallback

    lines: list[str] = []
    cb = MemestCallback(log=lines.append, results_path=tmp_path / "results")
    _train(tmp_path, _model(), cb, optim="adamw_torch")
    w = cb.watch
    assert w.values["micro_batch_size"] == BATCH and w.values["seq_len"] == SEQ
    assert w._workload.precision.value == "fp32" and w._workload.optimizer.value == "adamw"
    assert w._workload.stack.value == "hf-trainer"
    (rec,) = _records(tmp_path / "results" / "cpu.jsonl")
    assert rec["origin"] == "hf-callback" and rec["inputs"]["steps"] == 2
    m = rec["measured"][0]
    assert m["backend"] == "cpu" and len(m["step_peak_bytes"]) == 2
    assert m["static"]["weights"] == P * 4
    assert m["static"]["optimizer_states"] == 2 * P * 4 + TENSORS * 4
    rows = {r["name"]: r for r in rec["comparison"]["ranks"][0]["rows"]}
    peak = rows["peak allocated"]
    assert peak["measured"] == m["peak_allocated_bytes"] > 3 * P * 4  # weights + states + the step's activations
    assert abs(peak["error"]) <= TOLERANCE
    assert any(line.startswith("memest: rank 0 on cpu, 2 measured steps") for line in lines)
    assert any("peak allocated: predicted" in line for line in lines)


@pytest.mark.slow
def test_hf_trainer_peft_lora_measured_against_the_estimate(tmp_path):
    """PEFT LoRA r 8 on q_proj, v_proj over an fp32 base with bf16=True (autocast): read as lora, rank 8,
    targets q_proj,v_proj, precision amp. Adapters per layer q r x (128 + 128) = 2,048 + v r x (128 + 64) =
    1,536: 3,584 x 3 = 10,752 fp32 parameters, AdamW states 2 x 10,752 x 4 B + 4 B per adapter tensor (12)."""
    from memest.integrations.hf import MemestCallback

    cb = MemestCallback(log=lambda line: None, results_path=tmp_path / "r.jsonl")
    _train(tmp_path, _model(lora=["q_proj", "v_proj"]), cb, optim="adamw_torch", bf16=True)
    w = cb.watch
    t = w._workload
    assert t.method.value == "lora" and t.lora.rank == 8 and t.lora.targets == "q_proj,v_proj"
    assert t.precision.value == "amp"
    (rec,) = _records(tmp_path / "r.jsonl")
    adapters = 3 * (8 * (128 + 128) + 8 * (128 + 64))
    assert rec["measured"][0]["static"]["optimizer_states"] == 2 * adapters * 4 + 12 * 4
    assert rec["measured"][0]["static"]["weights"] == (P + adapters) * 4
    rows = {r["name"]: r for r in rec["comparison"]["ranks"][0]["rows"]}
    assert abs(rows["peak allocated"]["error"]) <= TOLERANCE


def test_callback_warns_before_step_one_and_a_failure_never_stops_the_run(tmp_path):
    """A 2 MiB device (2,097,152 B) cannot hold the job (its weights alone are P x 4 B = 2,670,080 B): the warning comes at
    on_train_begin (seq_len given), before any step. A bad setting inside the callback is logged once and
    the Trainer finishes its steps. One optimizer step: nothing measured, said so."""
    from memest.integrations.hf import MemestCallback

    lines: list[str] = []
    cb = MemestCallback(seq_len=SEQ, gpu="2MiB", record=False, log=lines.append)
    out = _train(tmp_path, _model(), cb, steps=1)
    assert out.global_step == 1
    assert any("this job will not fit" in line for line in lines)
    assert any("nothing was measured" in line for line in lines)

    lines.clear()
    bad = MemestCallback(seq_len=-5, record=False, log=lines.append)
    out = _train(tmp_path, _model(), bad, steps=1)
    assert out.global_step == 1
    failures = [line for line in lines if "memest stops watching this run" in line]
    assert len(failures) == 1 and "seq_len" in failures[0]


@pytest.mark.slow
def test_track_plain_loop_measured_against_the_estimate(tmp_path):
    """A plain loop: fp32 model, torch AdamW (foreach, as tests/cpu_measure.py), one step before the block
    (the optimizer states exist), two inside it; micro-batch and tokens read from the first forward."""
    import torch

    import memest

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, TINY["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with memest.track(model, opt, log=lambda line: None, results_path=tmp_path) as t:
        step()
        step()
    assert t.watch.values["micro_batch_size"] == BATCH and t.watch.values["seq_len"] == SEQ
    rows = {r["name"]: r for r in t.report}
    assert rows["weights"]["measured"] == P * 4
    assert abs(rows["peak allocated"]["error"]) <= TOLERANCE
    (rec,) = _records(tmp_path / "cpu.jsonl")
    assert rec["origin"] == "track" and rec["inputs"]["workload"]["stack"] == "pytorch"


@pytest.mark.slow
def test_lightning_callback_measured_against_the_estimate(tmp_path):
    """The Lightning callback over the same tiny Llama: fp32 ('32-true'), torch AdamW (foreach), 3 optimizer
    steps, micro-batch and tokens from the first batch; the weights P x 4 B, the peak within 10%."""
    pytest.importorskip("lightning", reason="lightning is not installed (memest does not depend on it): the "
                                            "Lightning callback is not tested here")
    import lightning
    import torch

    from memest.integrations.lightning import MemestLightningCallback

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _model()

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)

    cb = MemestLightningCallback(log=lambda line: None, results_path=tmp_path)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, callbacks=[cb],
                                default_root_dir=str(tmp_path))
    trainer.fit(Module(), torch.utils.data.DataLoader(_dataset(), batch_size=BATCH))
    assert trainer.global_step == 3
    w = cb.watch
    assert w.values["micro_batch_size"] == BATCH and w.values["seq_len"] == SEQ
    (rec,) = _records(tmp_path / "cpu.jsonl")
    assert rec["origin"] == "lightning" and rec["inputs"]["steps"] == 2
    assert rec["measured"][0]["static"]["weights"] == P * 4
    rows = {r["name"]: r for r in rec["comparison"]["ranks"][0]["rows"]}
    assert abs(rows["peak allocated"]["error"]) <= TOLERANCE


def _tiny_llama_loop(batch: int, seq: int, autocast: bool):
    """transformers' LlamaConfig with 2 layers of h 64 (i 128, 4 heads / 2 KV heads, V 32,000), torch AdamW, one
    step run before the block; returns (model, optimizer, step)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, 32_000, (batch, seq), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    return model, opt, step


def test_track_reads_autocast_and_says_it_in_the_job_line(tmp_path):
    """A loop whose forward runs under torch.autocast(bf16) over fp32 parameters is precision amp (fp32 params,
    autocast bf16), read in the first forward; the job line says that recipe, never "autocast(bf16): precision
    fp32". Without autocast the job line names no bf16 switch: "PyTorch: precision fp32"."""
    import memest

    lines: list[str] = []
    model, opt, step = _tiny_llama_loop(1, 16, autocast=True)
    with memest.track(model, opt, log=lines.append, results_path=tmp_path) as t:
        step()
    assert t.watch.values["precision"].value == "amp"
    job = next(x for x in lines if x.startswith("memest: llama ("))
    assert "PyTorch, torch.autocast(bf16): fp32 params, autocast bf16" in job and "precision fp32" not in job
    lines.clear()
    model, opt, step = _tiny_llama_loop(1, 16, autocast=False)
    with memest.track(model, opt, log=lines.append, results_path=tmp_path) as t:
        step()
    job = next(x for x in lines if x.startswith("memest: llama ("))
    assert t.watch.values["precision"].value == "fp32" and "PyTorch: precision fp32" in job and "autocast" not in job


def test_track_compares_terms_of_the_same_moment(tmp_path):
    """The same loop under autocast estimated as fp32 (precision given): the fp32 estimate peaks at its optimizer
    step, weights W + gradients W + AdamW's 2 W + its foreach temporary W = 5 W (W = 4 B x 4.17 M params =
    15.9 MiB: 2 x 32,000 x 64 embedding / lm_head + 2 layers), while the run's peak is in its loss (the autocast
    copies the fp32 estimate leaves out lift the forward above 5 W at 80 tokens). The per-term rows then take
    the estimate's moment nearest the measured breakdown: no row is a term the other side has none of (the
    -100% / measured 0 rows of comparing an optimizer-step estimate with a forward measurement)."""
    import memest

    model, opt, step = _tiny_llama_loop(1, 80, autocast=True)
    with memest.track(model, opt, log=lambda line: None, results_path=tmp_path, precision="fp32") as t:
        step()
        step()
    assert t.estimate.extra["peak_moment"] == "optimizer_step"
    rank = t.calibration.ranks[0]
    per_term = [r for r in rank.rows if not r.total]
    assert per_term and all(r.moment not in (None, "optimizer_step") for r in per_term)
    for r in per_term:  # the same moment: both sides hold the term, or neither does
        assert (r.predicted > 0) == (r.measured > 0), r
    (rec,) = _records(tmp_path / "cpu.jsonl")
    assert {row["moment"] for row in rec["comparison"]["ranks"][0]["rows"] if row["name"] == "weights"} == {
        per_term[0].moment}
