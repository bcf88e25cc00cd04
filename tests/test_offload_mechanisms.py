"""CPU offload under FSDP, torchtune's optimizer step in backward and activation offloading (torchtune,
unsloth): what each leaves on the device, the host RAM it needs, the stacks that have it, and torchtune's
published sweep of these switches."""

from __future__ import annotations

import pytest
from inprocess import run_memest

from memest.devices import get_device
from memest.estimate import estimate
from memest.estimate.training.step import moments
from memest.sources import load_model
from memest.validation.cases import cases_by_id
from memest.workload import Framework, Loss, Optimizer, Precision, Recompute, Stack, TrainingConfig
from memest.workload.resolve import resolve

A100 = get_device("A100-80GB")
H100 = get_device("H100")
MiB = 1 << 20
GiB = 1 << 30

# Llama-3.2-1B: 16 layers, h 2048, V 128256, tied embeddings; a layer holds q, o 2048 x 2048, k, v 512 x 2048,
# gate, up, down 8192 x 2048 and two 2048 norms = 4,194,304 x 2 + 1,048,576 x 2 + 16,777,216 x 3 + 4,096
# = 60,821,504 elements; the embedding 128256 x 2048 = 262,668,288 elements
LAYER = 60_821_504
EMBEDDING = 262_668_288


@pytest.fixture(scope="module")
def llama():
    return load_model("meta-llama/Llama-3.2-1B")


def named(terms, name):
    return sum(t.bytes for t in terms if t.name == name)


# ---- torchtune optimizer_in_bwd ----

def test_optimizer_in_backward_keeps_one_gradient(llama):
    # register_optim_in_bwd_hooks: each parameter steps and is zeroed in its post-accumulate-grad hook, so
    # at most one gradient is alive: the largest, the tied embedding's, 262,668,288 x 2 B = 501 MiB, which
    # the caching allocator rounds to a 502 MiB segment (the 1 MiB left is not split off)
    t = TrainingConfig(precision=Precision.BF16, optimizer=Optimizer.ADAMW, recompute=Recompute.FULL,
                       framework=Framework.PYTORCH, optimizer_in_bwd=True)
    by_moment = moments(llama, t, A100)
    assert named(by_moment["last_layer_backward"], "gradients") == 502 * MiB
    assert named(by_moment["first_layer_backward"], "gradients") == 502 * MiB
    # nothing left at the step: no gradients, and foreach AdamW's sqrt temporary is made per parameter in
    # backward (the largest: 501 MiB -> 502 MiB), not over all of them at the step
    assert named(by_moment["optimizer_step"], "gradients") == 0
    assert named(by_moment["optimizer_step"], "workspace.optimizer_step") == 0
    assert named(by_moment["last_layer_backward"], "workspace.optimizer_step") == 502 * MiB
    # without it every gradient exists at the step: 1,235,814,400 x 2 B at least
    plain = moments(llama, t.replace(optimizer_in_bwd=False), A100)
    assert named(plain["optimizer_step"], "gradients") >= 2 * llama.num_params


def test_optimizer_in_backward_under_fsdp_keeps_one_units_shard(llama):
    # foreach_reduce views a unit's sharded gradients out of one reduce-scatter output and runs the hooks in
    # that loop: the largest unit is the root (the embedding, 262,668,288 elements, + the final norm's 2,048),
    # / 8 ranks x 4 B (fp32 reduce) = 131,335,168 B = 125.25 MiB -> a 126 MiB segment (0.75 MiB left unsplit)
    t = TrainingConfig(precision=Precision.FSDP2, framework=Framework.FSDP, recompute=Recompute.FULL,
                       parallelism=resolve({"train": True, "fsdp": "full_shard", "gpus": 8}, llama, H100).parallelism,
                       optimizer_in_bwd=True)
    by_moment = moments(llama, t, H100)
    assert named(by_moment["last_layer_backward"], "gradients") == 126 * MiB
    assert named(by_moment["optimizer_step"], "gradients") == 0


def test_optimizer_in_backward_is_torchtunes_and_refuses_accumulation():
    out = run_memest("hf", "meta-llama/Llama-3.2-1B", "--train", "--stack", "torchtune", "--optimizer-in-bwd",
                     "--grad-accum-steps", "4")
    assert out.returncode == 2 and "--grad-accum-steps 1" in out.stderr and "Traceback" not in out.stderr
    out = run_memest("hf", "meta-llama/Llama-3.2-1B", "--train", "--optimizer-in-bwd")  # the HF Trainer has none
    assert out.returncode == 2 and "--stack torchtune" in out.stderr
    out = run_memest("hf", "meta-llama/Llama-3.2-1B", "--train", "--stack", "torchtune", "--optimizer-in-bwd")
    assert out.returncode == 0, out.stderr
    assert "optimizer_in_bwd True" in " ".join(out.stdout.split())  # the job line


# ---- activation offloading ----

def test_torchtune_activation_offloading_keeps_its_forward_stash(llama):
    # recompute full: one checkpoint per layer, b x s x h x 2 B = 2048 x 2048 x 2 = 8 MiB; OffloadActivations
    # (max_fwd_stash_size 5) keeps at most 5 on the device, the other 11 of 16 in host RAM; through the loss of
    # a full fine-tune none (the final norm's 6 saved-tensor ids fill the stash: tests/test_activation_offload_loss.py)
    values = {"train": True, "stack": "torchtune", "activation_offloading": True, "seq_len": 2048}
    t = resolve(values, llama, A100)
    assert t.activation_offloading and t.recompute is Recompute.FULL
    by_moment = moments(llama, t, A100)
    assert named(by_moment["first_layer_backward"], "activations.checkpoints") == 5 * 8 * MiB
    assert named(by_moment["loss_forward"], "activations.checkpoints") == 0
    assert estimate(llama, t, A100).host_bytes == 11 * 8 * MiB
    off = moments(llama, t.replace(activation_offloading=False), A100)
    assert named(off["loss_forward"], "activations.checkpoints") == 16 * 8 * MiB


def test_unsloth_offloads_its_checkpoints_by_default(llama):
    # use_gradient_checkpointing="unsloth": each layer's input to host, one brought back for its backward;
    # unsloth's recipe autocasts over fp32 parameters, so the residual stream (the checkpoints) is fp32:
    # 2048 x 2048 x 4 B = 16 MiB each, 1 on the device, 15 in host RAM
    t = resolve({"train": True, "stack": "unsloth", "seq_len": 2048}, llama, A100)
    assert t.stack is Stack.UNSLOTH and t.activation_offloading
    assert named(moments(llama, t, A100)["loss_forward"], "activations.checkpoints") == 16 * MiB
    assert estimate(llama, t, A100).host_bytes == 15 * 16 * MiB
    # without checkpointing there is nothing to offload: the stack's default follows recompute
    assert not resolve({"train": True, "stack": "unsloth", "recompute": "none"}, llama, A100).activation_offloading


def test_trl_offloads_with_torchtunes_stash(llama):
    # trl SFTConfig(activation_offloading=True) runs torchtune's OffloadActivations port (stash of 5); the HF
    # Trainer's autocast over fp32 parameters makes the checkpoints fp32: 16 MiB each, 5 kept, 11 in host RAM
    t = resolve({"train": True, "stack": "trl", "recompute": "full", "activation_offloading": True, "seq_len": 2048},
                llama, A100)
    assert named(moments(llama, t, A100)["loss_forward"], "activations.checkpoints") == 5 * 16 * MiB
    assert estimate(llama, t, A100).host_bytes == 11 * 16 * MiB
    assert not resolve({"train": True, "stack": "trl", "recompute": "full"}, llama, A100).activation_offloading


def test_activation_offloading_needs_checkpoints_and_a_stack_that_has_it():
    out = run_memest("hf", "meta-llama/Llama-3.2-1B", "--train", "--stack", "torchtune", "--recompute", "none",
                     "--activation-offloading")
    assert out.returncode == 2 and "--recompute full" in out.stderr
    out = run_memest("hf", "meta-llama/Llama-3.2-1B", "--train", "--stack", "deepspeed", "--activation-offloading")
    assert out.returncode == 2 and "--stack trl or torchtune or unsloth" in out.stderr


# ---- FSDP CPU offload ----

def _fsdp(llama, **values):
    return resolve({"train": True, "fsdp": "full_shard", "gpus": 8, **values}, llama, H100)


def test_fsdp_cpu_offload_keeps_no_sharded_gradients_on_the_device(llama):
    # CPUOffloadPolicy: foreach_reduce copies each sharded gradient to host after its reduce-scatter, the
    # optimizer steps on the host shards: no gradient, master or optimizer state on the device at any moment
    t = _fsdp(llama, offload="params")
    for name, terms in moments(llama, t, H100).items():
        assert named(terms, "gradients") == 0, name
        assert named(terms, "weights") == 0 and named(terms, "optimizer_states.moments") == 0, name
    # the unit's unsharded gradients are still made on the device (largest layer x 2 B)
    assert named(moments(llama, t, H100)["last_layer_backward"], "workspace.unsharded_grads") == LAYER * 2


def test_fsdp_cpu_offload_copies_a_layers_shards_in(llama):
    # the copy-in stream holds the next layer's host shards copied to the device (fp32, LAYER / 8 x 4 B =
    # 30,410,752 B = 29 MiB: a 30 MiB segment, 1 MiB left unsplit) and their bf16 cast (15,205,376 B =
    # 14.5 MiB: its 16 MiB segment splits, 1.5 MiB > 1 MiB) beside the gathered outputs
    pool = [named(estimate(llama, _fsdp(llama, **kw), H100).terms, "allocator.all_gather_stream")
            for kw in ({}, {"offload": "params"})]
    assert pool[1] - pool[0] == 30 * MiB + 15_205_376


@pytest.mark.parametrize(("values", "per_param"), [
    ({}, 16),                                 # fsdp2: fp32 params 4 + fp32 grads 4 + Adam 2 x 4
    ({"stack": "torchtune"}, 8),              # pure bf16: params 2 + bf16 grads 2 + Adam 2 x 2
])
def test_fsdp_cpu_offload_host_ram(llama, values, per_param):
    # per rank P/8 of each, eight ranks on the node: per_param x P in all
    t = _fsdp(llama, offload="params", **values)
    assert estimate(llama, t, H100).host_bytes == per_param * llama.num_params


# ---- torchtune's published sweep (README "Optimization flags", Llama-3.2-3B, one A100, 2 x 4096 packed) ----

SWEEP = {row["technique"]: row["measured"]["peak_memory_active_GiB"]
         for row in cases_by_id()["torchtune_llama32_3b_full_packed_a100"]["sweep"]}


def test_torchtunes_sweep_of_offloading_and_the_step_in_backward():
    spec = load_model("meta-llama/Llama-3.2-3B-Instruct")
    ac = TrainingConfig(micro_batch_size=2, seq_len=4096, precision=Precision.BF16, optimizer=Optimizer.ADAMW_FUSED,
                        framework=Framework.PYTORCH, loss=Loss.CHUNKED, recompute=Recompute.FULL, torch_compile=True)
    in_bwd = ac.replace(optimizer_in_bwd=True)
    offloaded = in_bwd.replace(activation_offloading=True)

    def peak(t):
        return estimate(spec, t, A100).per_device.allocated_bytes / GiB

    # each row adds a switch to the one before; torch.compile is on from the second row (the compiled chunked
    # loss: tests/test_chunked_loss_measured.py), so each row is compared within 10%
    for t, row in ((ac, "+ activation checkpointing"), (in_bwd, "+ optimizer step fused into backward"),
                   (offloaded, "+ activation offloading"),
                   (offloaded.replace(optimizer=Optimizer.ADAMW8BIT), "+ 8-bit AdamW")):
        assert abs(peak(t) / SWEEP[row] - 1) <= 0.10, (row, peak(t), SWEEP[row])
    # the switch itself: activation offloading saved 23.1 - 21.8 = 1.3 GiB; memest's step moves 28 layers'
    # checkpoints but 5 to host (23 x 2 x 4096 x 3072 x 2 B = 1.08 GiB)
    saved = SWEEP["+ optimizer step fused into backward"] - SWEEP["+ activation offloading"]
    assert abs((peak(in_bwd) - peak(offloaded)) - saved) <= 0.3


def test_optimizer_in_backward_keeps_no_gradients_in_host_ram(llama):
    # torchtune's optimizer_in_bwd under FSDP2 CPU offload: foreach_reduce copies each sharded gradient to the host
    # and calls its post-accumulate-grad hook at once (torch 2.13 _fsdp_collectives.py), which steps the parameter
    # and frees the gradient (torchtune register_optim_in_bwd_hooks: step(), zero_grad()): host RAM holds the bf16
    # params 2 + Adam 2 x 2 = 6 B/param (not the 8 with bf16 grads 2), plus the two consecutive gradient shards the
    # loop holds at once; the largest pair: the embedding (262,668,288 / 8 = 32,833,536) and the first layer's
    # input_layernorm (2048 / 8 = 256), x 2 B, on each of the node's 8 ranks
    t = _fsdp(llama, offload="params", stack="torchtune", optimizer_in_bwd=True)
    in_flight = 8 * 2 * (32_833_536 + 256)
    assert estimate(llama, t, H100).host_bytes == 6 * llama.num_params + in_flight
