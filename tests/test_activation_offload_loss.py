"""torchtune's activation offloading through the loss: the forward stash after the final norm.

torchtune 1814feb17 ``torchtune/training/_activation_offloading.py`` ``OffloadActivations.pack_tensor`` gives every
saved tensor an id and, packing one of at least 1024 B that is no Parameter, drops the stash entries of ids at
or below ``id - max_fwd_stash_size`` (5); the final ``RMSNorm`` (``torchtune/modules/rms_norm.py``, eager) is the
last module under the context (the output projection runs under ``NoOpManager``, the loss outside it). What
memest counts is derived by hand; which tensors autograd saves, in which order, is counted on the CPU below.
"""

from __future__ import annotations

import pytest

from memest.devices import get_device
from memest.estimate.training.step import moments
from memest.sources import load_model
from memest.workload import (
    Framework,
    KbitPrep,
    LoraConfig,
    LoraLibrary,
    Loss,
    Method,
    Optimizer,
    Precision,
    Recompute,
    Stack,
    TrainingConfig,
    offloaded_checkpoints_at_loss,
)
from memest.workload.stacks import TORCHTUNE_FINAL_NORM_IDS, TORCHTUNE_FWD_STASH

# Llama-3.2-3B (h 3,072), the README 'Optimization flags' rows: batch 2 x 4,096 packed tokens, bf16
CHECKPOINT = 2 * 4_096 * 3_072 * 2    # one layer input b x s x h x 2 B = 50,331,648 B (24 x 2 MiB, no rounding)


def _job(**kw) -> TrainingConfig:
    return TrainingConfig(micro_batch_size=2, seq_len=4_096, precision=Precision.BF16, optimizer=Optimizer.ADAMW_FUSED,
                          framework=Framework.PYTORCH, lora_library=LoraLibrary.TORCHTUNE, prepare_kbit_training=KbitPrep.NONE,
                          torch_compile=True, loss=Loss.CHUNKED, recompute=Recompute.FULL,
                          **{"activation_offloading": True, **kw})


def _checkpoints(t: TrainingConfig) -> dict[str, int]:
    m = moments(load_model("meta-llama/Llama-3.2-3B-Instruct"), t, get_device("A100-80GB"))
    return {moment: sum(x.bytes for x in terms if x.name == "activations.checkpoints")
            for moment, terms in m.items() if moment in ("loss_forward", "loss_backward", "first_layer_backward")}


def test_lora_keeps_the_last_layer_input_through_the_loss():
    # the norm takes 4 of the stash's 5 ids (x.float() twice, rsqrt's output twice; the frozen scale's id comes
    # after the last offloaded one): 5 - 4 = 1 layer input through the loss, 1 x 50,331,648 B; the last layer's
    # backward still counts the stash's 5: 251,658,240 B
    t = _job(method=Method.LORA, lora=LoraConfig(rank=64, targets="q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"))
    assert offloaded_checkpoints_at_loss(t) == 1
    assert _checkpoints(t) == {"loss_forward": CHECKPOINT, "loss_backward": CHECKPOINT,
                               "first_layer_backward": 5 * CHECKPOINT}


def test_full_finetune_keeps_no_layer_input_through_the_loss():
    # the trained scale adds its own id and x_normed (offloaded): the norm's 6 ids push every layer input out
    assert offloaded_checkpoints_at_loss(_job()) == 0
    assert _checkpoints(_job()) == {"loss_forward": 0, "loss_backward": 0, "first_layer_backward": 5 * CHECKPOINT}


def test_other_stacks_and_no_offloading_unchanged():
    # trl's port runs transformers' reentrant checkpointing (its saved inputs not counted): the stash's 5; no
    # offloading: every layer input (28 x 50,331,648 B) through the loss as in the backward
    assert offloaded_checkpoints_at_loss(_job(stack=Stack.TRL)) == TORCHTUNE_FWD_STASH
    plain = _job(activation_offloading=False)
    assert offloaded_checkpoints_at_loss(plain) == 0
    assert _checkpoints(plain) == dict.fromkeys(("loss_forward", "loss_backward", "first_layer_backward"),
                                                28 * CHECKPOINT)


# --- counted on the CPU -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _stash_after_forward(torch, scale_trains: bool) -> tuple[int, int]:
    """A tiny torchtune-like decoder (checkpointed layers with LoRA-like trained paths, the final RMSNorm, the
    output under a no-op hook) run under ``pack_tensor``'s id and eviction rule: (the norm's ids up to its last
    offloaded tensor, the layer inputs the stash holds after the forward)."""
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    b, s, h, v, n_layers, stash_size, min_bytes = 2, 256, 64, 512, 4, TORCHTUNE_FWD_STASH, 1024
    ids: list[bool] = []          # per id: offloaded (>= 1024 B, no Parameter)
    stash: dict[int, object] = {}

    def pack(a):
        ids.append(a.element_size() * a.nelement() >= min_bytes and not isinstance(a, nn.Parameter))
        tid = len(ids)
        if ids[-1]:
            for k in [k for k in stash if k <= tid - stash_size]:
                del stash[k]
            stash[tid] = a
        return a

    class RMSNorm(nn.Module):  # torchtune 1814feb17 torchtune/modules/rms_norm.py
        def __init__(self):
            super().__init__()
            self.scale, self.eps = nn.Parameter(torch.ones(h)), 1e-6

        def forward(self, x):
            x_fp32 = x.float()
            x_normed = (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
            return x_normed * self.scale

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.w = RMSNorm(), nn.Linear(h, h, bias=False)
            self.a, self.b = nn.Linear(h, 4, bias=False), nn.Linear(4, h, bias=False)

        def forward(self, x, mask=None, input_pos=None):
            y = self.norm(x)
            return x + self.w(y) + self.b(self.a(y))

    torch.manual_seed(0)
    layers = nn.ModuleList(Layer() for _ in range(n_layers)).to(torch.bfloat16)
    norm, out = RMSNorm().to(torch.bfloat16), nn.Linear(h, v, bias=False).to(torch.bfloat16)
    for p in [*layers.parameters(), *norm.parameters(), *out.parameters()]:
        p.requires_grad_(scale_trains)
    for layer in layers:
        layer.a.weight.requires_grad_(True)
        layer.b.weight.requires_grad_(True)
    x = torch.randn(b, s, h, dtype=torch.bfloat16)
    inputs = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for layer in layers:
            inputs.append(x)
            x = checkpoint(layer, x, mask=None, input_pos=torch.arange(s).expand(b, s), use_reentrant=False)
        before_norm = len(ids)
        x = norm(x)
        last_offloaded = max(i + 1 for i, off in enumerate(ids) if off)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):  # NoOpManager
            logits = [out(c) for c in x.chunk(8, dim=1)]
    assert len(logits) == 8 and len(ids) == last_offloaded + (0 if scale_trains else 1)  # the frozen scale's id
    kept = {t.data_ptr() for t in inputs}
    return last_offloaded - before_norm, sum(a.data_ptr() in kept for a in stash.values())


@pytest.mark.parametrize("scale_trains", [False, True], ids=["lora", "full"])
def test_final_norm_ids_and_layer_inputs_left_counted(torch, scale_trains):
    norm_ids, left = _stash_after_forward(torch, scale_trains)
    assert norm_ids == TORCHTUNE_FINAL_NORM_IDS[scale_trains]
    assert left == max(0, TORCHTUNE_FWD_STASH - TORCHTUNE_FINAL_NORM_IDS[scale_trains])
