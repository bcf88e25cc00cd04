"""torchtune ``custom_sharded_layers``: the token embedding and the output projection as FSDP2 units of their own
(torchtune commit 30b8519e86d2, ``recipes/full_finetune_distributed.py`` ``_setup_model`` and
``torchtune/training/_distributed.py`` ``shard_model``: ``fully_shard`` on each named module, then on the root, which
keeps the final norm), each gathered only while it computes (memest/estimate/training/fsdp.py ``own_units``)."""

from __future__ import annotations

import pytest

from memest.devices import get_device
from memest.errors import InputError
from memest.estimate import estimate
from memest.estimate.training import moments
from memest.sources import load_model
from memest.workload import (
    Framework,
    Loss,
    Offload,
    Optimizer,
    Parallelism,
    Precision,
    Recompute,
    TrainingConfig,
    files,
)
from memest.workload.validate import validate

A100 = get_device("A100-80GB")
# Llama-3.1-70B: vocab V 128256, hidden h 8192, untied. One V x h matrix: 128256 x 8192 = 1,050,673,152 elements,
# x 2 B (bf16, gathered at the recipe's compute dtype) = 2,101,346,304 B. The final norm: 8192 x 2 = 16,384 B.
VH_BYTES = 128256 * 8192 * 2
assert VH_BYTES == 2_101_346_304
NORM_BYTES = 8192 * 2
TUNE = TrainingConfig(micro_batch_size=2, seq_len=2048, precision=Precision.BF16, optimizer=Optimizer.ADAMW_FUSED,
                      recompute=Recompute.FULL, loss=Loss.CHUNKED, torch_compile=True, framework=Framework.FSDP,
                      offload=Offload.PARAMS, parallelism=Parallelism(dp=8, zero_stage=3))
OWN = TUNE.replace(custom_sharded_layers="tok_embeddings,output")


@pytest.fixture(scope="module")
def llama70():
    return load_model("meta-llama/Llama-3.1-70B")


def _bytes(moment_terms, name: str) -> int:
    return sum(x.bytes for x in moment_terms if x.name == name)


def test_the_root_unit_keeps_embedding_and_output_at_every_moment_without_it(llama70):
    # the root unit: embedding + output + final norm = 2 x 2,101,346,304 + 16,384 = 4,202,708,992 B, every moment
    m = moments(llama70, TUNE, A100)
    for name in ("layer_forward", "loss_forward", "loss_backward", "first_layer_backward", "last_layer_backward"):
        assert _bytes(m[name], "workspace.gathered_root") == 2 * VH_BYTES + NORM_BYTES, name
        assert _bytes(m[name], "workspace.gathered_output") == _bytes(m[name], "workspace.gathered_embedding") == 0


def test_each_own_unit_is_gathered_only_while_it_computes(llama70):
    m = moments(llama70, OWN, A100)
    for name in ("layer_forward", "loss_forward", "loss_backward", "first_layer_backward", "last_layer_backward"):
        assert _bytes(m[name], "workspace.gathered_root") == NORM_BYTES, name  # only the final norm is left there
    # the output: from its forward through the loss backward
    for name, output, embedding in (("layer_forward", 0, 0), ("loss_forward", VH_BYTES, 0),
                                    ("loss_backward", VH_BYTES, 0), ("first_layer_backward", 0, 0),
                                    ("last_layer_backward", 0, VH_BYTES)):  # the embedding prefetched for its backward
        assert _bytes(m[name], "workspace.gathered_output") == output, name
        assert _bytes(m[name], "workspace.gathered_embedding") == embedding, name
    # the layer units are as before: the loss backward holds the last layer, prefetched
    before = moments(llama70, TUNE, A100)
    for name in m:
        assert _bytes(m[name], "workspace.gathered_layers") == _bytes(before[name], "workspace.gathered_layers")
    # each moment is one V x h matrix lighter where one was computing, two where none was
    for name, less in (("layer_forward", 2 * VH_BYTES), ("loss_forward", VH_BYTES), ("loss_backward", VH_BYTES),
                       ("first_layer_backward", 2 * VH_BYTES), ("last_layer_backward", VH_BYTES)):
        assert sum(x.bytes for x in before[name]) - sum(x.bytes for x in m[name]) == less, name


def test_the_all_gather_stream_caches_one_matrix_beside_a_layer(llama70):
    # the stream pool: the largest non-layer unit's all-gather output as the CUDA caching allocator counts it
    # (a >= 10 MiB segment rounded to 2 MiB, the rest split off when over 1 MiB: the request rounded to 512 B). The
    # root: 2 x 2,101,346,304 + 16,384 = 4,202,708,992 B (2005 x 2 MiB leaves 2,080,768 B > 1 MiB: split; a 512 B
    # multiple); one V x h matrix: 2,101,346,304 B = 1002 x 2 MiB exactly. The layer's and the host shards' blocks
    # are unchanged: the pool shrinks by 4,202,708,992 - 2,101,346,304 = 2,101,362,688 B
    pool = {name: sum(x.bytes for x in estimate(llama70, t, A100).ranks[0].terms if x.name == "allocator.all_gather_stream")
            for name, t in (("root", TUNE), ("own", OWN))}
    assert pool["root"] - pool["own"] == 2 * VH_BYTES + NORM_BYTES - VH_BYTES == 2_101_362_688


def test_a_tied_embedding_stays_in_the_root():
    # Llama-3.2-1B ties its output to the embedding (torchtune TiedLinear reads tok_embeddings.weight outside the
    # module): the root keeps it, V 128256 x h 2048 x 2 B = 525,336,576 B, + the norm 2048 x 2 = 4,096 B
    spec = load_model("meta-llama/Llama-3.2-1B")
    t = OWN.replace(parallelism=Parallelism(dp=2, zero_stage=3))
    m = moments(spec, t, A100)
    assert _bytes(m["loss_backward"], "workspace.gathered_root") == 128256 * 2048 * 2 + 2048 * 2 == 525_340_672
    assert _bytes(m["last_layer_backward"], "workspace.gathered_embedding") == 0


def test_the_torchtune_reader_reads_it_and_notes_other_names(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  _component_: torchtune.models.llama3_1.llama3_1_70b\n"
                      "custom_sharded_layers: ['tok_embeddings', 'output', 'layers.0.attn']\n")
    r = files.read([recipe])
    assert (r.values["custom_sharded_layers"], r.origins["custom_sharded_layers"]) == (
        "tok_embeddings,output", "r.yaml:3 custom_sharded_layers")
    assert any("custom_sharded_layers names layers.0.attn" in n for n in r.notes)


def test_bad_values_are_refused(llama70):
    with pytest.raises(InputError, match="'lm_head'") as e:
        validate(llama70, OWN.replace(custom_sharded_layers="lm_head"))
    assert e.value.field == "custom_sharded_layers"


def test_other_frameworks_do_not_read_it(llama70):
    # DeepSpeed ZeRO-3 has no FSDP units: the same estimate with or without it
    ds = TUNE.replace(framework=Framework.DEEPSPEED, precision=Precision.MIXED, offload=Offload.NONE)
    assert estimate(llama70, ds, A100).ranks == estimate(llama70, ds.replace(custom_sharded_layers="output"),
                                                         A100).ranks
