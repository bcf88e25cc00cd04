"""llama.cpp / Ollama (``--engine llama.cpp`` / ``ollama``): ggml block sizes, llama-quant's Q4_K_M mix,
the -ngl layer split, the KV cache types, the GGUF header reader, bad input.

Every expected value is derived by hand below from llama.cpp's structs and rules (b4715).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memest.errors import InputError
from memest.estimate.serving.llamacpp import engine
from memest.estimate.serving.llamacpp.quant import quantized_tensors, type_counts
from memest.sources import load_config, spec_from_config
from memest.sources.ggml_types import ggml_type
from memest.workload import Engine, ServingConfig

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
MiB = 2**20


def _pythia(name: str = "EleutherAI/pythia-160m"):
    return spec_from_config(load_config(name))


# ggml-common.h block structs: ggml_half = 2 B, QK_K = 256, QK4_0 = QK8_0 = 32
BLOCKS = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q4_0": (32, 2 + 32 // 2),                        # d + 4-bit quants = 18
    "q4_1": (32, 2 + 2 + 32 // 2),                    # d, m + quants = 20
    "q5_0": (32, 2 + 4 + 32 // 2),                    # d + qh[4] + quants = 22
    "q5_1": (32, 2 + 2 + 4 + 32 // 2),                # = 24
    "q8_0": (32, 2 + 32),                             # d + int8[32] = 34
    "q2_K": (256, 256 // 16 + 256 // 4 + 2 + 2),      # scales[16] + qs[64] + d, dmin = 84
    "q3_K": (256, 256 // 8 + 256 // 4 + 12 + 2),      # hmask[32] + qs[64] + scales[12] + d = 110
    "q4_K": (256, 2 + 2 + 12 + 256 // 2),             # d, dmin + scales[12] + qs[128] = 144
    "q5_K": (256, 2 + 2 + 12 + 256 // 8 + 256 // 2),  # + qh[32] = 176
    "q6_K": (256, 256 // 2 + 256 // 4 + 256 // 16 + 2),  # ql[128] + qh[64] + scales[16] + d = 210
    "iq4_nl": (32, 2 + 32 // 2),                      # = 18
    "iq4_xs": (256, 2 + 2 + 256 // 64 + 256 // 2),    # d + scales_h + scales_l[4] + qs[128] = 136
}


@pytest.mark.parametrize("name", BLOCKS)
def test_bytes_per_block(name):
    t = ggml_type(name)
    assert (t.block, t.block_bytes) == BLOCKS[name]


def test_q4_k_m_mix_of_pythia_160m():
    """pythia-160m: 12 layers, h 768 (3 blocks of 256), ffn 3072, vocab 50304, untied head.

    llama_tensor_get_type (b4715) for Q4_K_M: output q6_K; token_embd q4_K; attn_qkv q5_K (its own
    branch); attn_output, ffn_up q4_K; ffn_down q6_K where use_more_bits(i, 12): i < 1, i >= 10 or
    (i - 1) % 3 == 2 -> i in {0, 3, 6, 9, 10, 11} (6 layers), else q4_K. 1-D tensors stay f32.
    """
    tensors = quantized_tensors(_pythia(), "q4_k_m")
    assert type_counts(tensors) == {"q4_K": 1 + 12 + 12 + 6, "q5_K": 12, "q6_K": 1 + 6, "f32": 12 * 8 + 2}
    down = {t.layer: t.type.name for t in tensors if t.category == "ffn_down"}
    assert [i for i, k in sorted(down.items()) if k == "q6_K"] == [0, 3, 6, 9, 10, 11]
    expected = (
        50304 * 3 * 144          # token_embd: 50304 rows x 3 blocks at q4_K
        + 50304 * 3 * 210        # output at q6_K
        + 12 * 2304 * 3 * 176    # attn_qkv 2304 x 768 at q5_K
        + 12 * 768 * 3 * 144     # attn_output 768 x 768 at q4_K
        + 12 * 3072 * 3 * 144    # ffn_up 3072 x 768 at q4_K
        + 6 * 768 * 12 * 144     # ffn_down 768 x 3072 at q4_K (6 layers)
        + 6 * 768 * 12 * 210     # ... at q6_K (6 layers)
        + 12 * (4 * 768 + 2304 + 768 + 3072 + 768) * 4  # per layer: 4 norm vectors + 4 biases, f32
        + 2 * 768 * 4            # final norm weight + bias
    )
    assert sum(t.nbytes for t in tensors) == expected


def test_ngl_split_puts_the_first_layers_and_output_in_ram():
    """-ngl 10 of pythia-2.8b (32 blocks + output): i_gpu_start = 32 - 10 = 22, blocks 22..31 on the
    GPU, the output layer (ngl <= 32) and token_embd on the host.

    f16 GGUF: a block is 78,643,200 f16 weights (qkv 7680 + out 2560 + up 10240 + down 10240 rows
    of 2560) = 157,286,400 B + 33,280 f32 (norms and biases) = 133,120 B -> 157,419,520 B.
    token_embd and output: 50304 x 2560 x 2 = 257,556,480 B each; output norm 2 x 2560 x 4 = 20,480 B.
    """
    spec = _pythia("EleutherAI/pythia-2.8b")
    s = ServingConfig(engine=Engine.LLAMACPP, quantization="f16", max_model_len=2048, n_gpu_layers=10)
    b = engine.buffers(spec, s)
    block = 157_286_400 + 133_120
    assert b.devices[0].layers == tuple(range(22, 32))
    assert b.devices[0].model == 10 * block
    assert b.host_model == 257_556_480 + 22 * block + 257_556_480 + 20_480
    assert b.offloaded == 10
    # KV: 2048 cells x 2560 x 2 B for K and again for V per layer; 22 layers' KV in RAM
    assert b.devices[0].kv == 10 * 2048 * 2560 * 2 * 2
    assert b.host_kv == 22 * 2048 * 2560 * 2 * 2


def test_kv_cache_types_change_bytes_per_element():
    """q8_0 cache: 34 B per 32 elements, q4_0: 18 per 32 (both need flash attention for V); n_ctx
    2048 stays 2048 with flash attention (a multiple of 256). pythia-2.8b: 32 layers x 2560 x 2048."""
    spec = _pythia("EleutherAI/pythia-2.8b")
    base = dict(engine=Engine.LLAMACPP, quantization="q8_0", max_model_len=2048, flash_attn=True)
    for kind, per_32 in (("f16", 64), ("q8_0", 34), ("q4_0", 18)):
        b = engine.buffers(spec, ServingConfig(kv_cache_dtype=kind, **base))
        assert b.k_bytes == b.v_bytes == 32 * 2048 * 2560 // 32 * per_32


def test_flash_attention_pads_n_ctx_to_256():
    """n_ctx 1000 -> 1024 cells with -fa (padding 256), 1024 without (padding 32: 1000 -> 1024 too);
    n_ctx 1030 -> 1280 with -fa, 1056 without."""
    spec = _pythia()
    for fa, n, cells in ((True, 1000, 1024), (False, 1000, 1024), (True, 1030, 1280), (False, 1030, 1056)):
        st = engine.settings(spec, ServingConfig(engine=Engine.LLAMACPP, max_model_len=n, flash_attn=fa))
        assert st.n_ctx == cells


def test_quantized_v_cache_needs_flash_attention():
    with pytest.raises(InputError, match="requires flash_attn"):
        engine.settings(_pythia(), ServingConfig(engine=Engine.LLAMACPP, kv_cache_dtype="q8_0"))


def test_tensor_split_assigns_layers_as_upper_bound():
    """-ts 10,6 over 64 blocks with -ngl 99 (65 layers): block il goes to GPU 0 while il / 65 < 10/16
    = 0.625, i.e. il <= 40: 41 blocks on GPU 0, 23 on GPU 1 plus the output layer (llama.cpp issue
    #11200's log: 41 x 68 MiB and 23 x 68 MiB of q8_0 KV)."""
    where = engine.layer_devices(64, 65, (10 / 16, 6 / 16))
    assert where[:64].count(0) == 41 and where[:64].count(1) == 23 and where[64] == 1


def test_gguf_header_round_trip(tmp_path):
    """A tiny GGUF written with gguf's writer reads back with its types and shapes, and its tensors
    replace the analytic layout."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from memest.sources.gguf import read_tensors

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float16))
    q8 = np.zeros((4, 34), dtype=np.uint8)  # 4 rows of one q8_0 block (34 B) = 4 x 32 elements
    w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)  # byte shape (4, 34)
    w.add_tensor("blk.0.attn_norm.weight", np.zeros((32,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tensors = read_tensors(path)
    assert tensors == (("token_embd.weight", "f16", (8, 32)), ("blk.0.attn_q.weight", "q8_0", (4, 32)),
                       ("blk.0.attn_norm.weight", "f32", (32,)))
    s = ServingConfig(engine=Engine.LLAMACPP, gguf_tensors=tensors, max_model_len=64)
    got = engine.file_tensors(_pythia(), s)
    assert sum(t.nbytes for t in got) == 8 * 32 * 2 + 4 * 34 + 32 * 4


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memest", "hf", "EleutherAI/pythia-160m", "--engine", "llama.cpp",
                           *args], capture_output=True, text=True, env=ENV, timeout=120)


@pytest.mark.parametrize(("args", "words"), [
    (("--quantization", "q4_k_x"), ("q4_k_x", "q4_k_m", "q8_0", "iq4_xs")),
    (("--kv-cache-dtype", "fp8"), ("fp8", "f16", "q8_0", "q4_0")),
    # 14 > the 13 layers offloads them all (-ngl 999 is llama.cpp's "all"), and -1 is its default: -2 is refused
    (("--n-gpu-layers", "-2"), ("-2", "0..13", "12 layers")),
    (("--tensor-split", "3,1"), ("3,1", "2 shares for 1 device")),
    (("--tensor-split", "a,b"), ("a,b", "numbers")),
])
def test_bad_input_is_one_line_exit_2(args, words):
    out = _run(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def test_flags_of_llamacpp_refused_for_vllm():
    out = subprocess.run([sys.executable, "-m", "memest", "hf", "EleutherAI/pythia-160m", "--n-gpu-layers", "3"],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 2 and "--engine llama.cpp" in out.stderr


def test_search_finds_best_quant_that_fits():
    """pythia-2.8b at n_ctx 2048 on a 4 GiB card (10% headroom: 3.6 GiB usable, less the context):
    Q8_0's 2.75 GiB file + 0.63 GiB KV does not fit fully; a smaller quant does, and Q8_0 fits with
    layers in RAM."""
    from memest.devices import get_device
    from memest.estimate.serving.llamacpp.fit import best, search

    spec = _pythia("EleutherAI/pythia-2.8b")
    device = get_device("4GB")
    options = search(spec, ServingConfig(engine=Engine.LLAMACPP, max_model_len=2048), device, 0.1)
    full, partial, _ = best(options)
    assert full is not None and full.full and full.quantization != "q8_0"
    assert partial is not None and partial.quantization == "q8_0" and 0 < partial.host_layers < partial.layers


def test_ollama_defaults():
    """Ollama 0.11.6: num_ctx 4096 (OLLAMA_CONTEXT_LENGTH), Q4_K_M library files, an f16 KV cache
    unless flash attention is on (OLLAMA_KV_CACHE_TYPE is read only then), num_batch 512.

    pythia-160m: 12 layers x 12 heads x 64 x (K + V) x 2 B = 36,864 B per cell; x 4096 cells."""
    from memest.estimate.serving.llamacpp import ollama

    spec = _pythia()
    s = ServingConfig(engine=Engine.OLLAMA, kv_cache_dtype="q8_0")
    assert ollama.kv_cache_type(s) == "f16"
    assert ollama.kv_cache_type(s.replace(flash_attn=True)) == "q8_0"
    assert engine.default_file_type(s) == "q4_k_m"
    e = ollama.estimate_layers(spec, s, (24 * 2**30,))
    assert e.kv == 12 * 12 * 64 * 2 * 2 * 4096
    assert e.layers_offload == e.layers_model == 13
    # q8_0 at 1 B per element in Ollama's own estimate (kvCacheBytesPerElement), half of f16
    assert ollama.estimate_layers(spec, s.replace(flash_attn=True), (24 * 2**30,)).kv == e.kv // 2


def test_cuda_context_from_the_ci_logs():
    """llamacpp_b4715_pythia28b_f16_v100: '15841 MiB free' at load on a V100-16GB (16,160 MiB NVML
    total) -> 319 MiB held before any buffer; no context on a CPU."""
    from memest.devices import get_device

    assert engine.context_bytes(get_device("V100-16GB")) == (16160 - 15841) * MiB


def test_hf_report_prints_the_quant_search():
    """pythia-2.8b at n_ctx 2048 on a 4 GB card (see test_search_finds_best_quant_that_fits): the
    report names a quant that fits fully and Q8_0 with layers in RAM, and the host RAM."""
    out = subprocess.run([sys.executable, "-m", "memest", "hf", "EleutherAI/pythia-2.8b", "--engine", "llama.cpp",
                          "--max-model-len", "2048", "--gpu", "4GB"], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("GGUF quants:"))
    assert "fits fully on the GPU at 2,048 tokens" in line and "Q8_0 fits with" in line and "layers in RAM" in line


@pytest.mark.parametrize(("args", "words"), [
    (["--engine", "llama.cpp", "--gpu", "RTX-4090,RTX-3090"], "split-mode layer over 2 GPUs, tensor-split by free memory"),
    (["--engine", "llama.cpp", "--gpu", "RTX-4090", "--gpus", "2", "--tensor-split", "10,6"],
     "split-mode layer over 2 GPUs, tensor-split 10,6"),
    (["--engine", "ollama", "--gpu", "RTX-4090,RTX-3090"], "layers split over 2 GPUs (Ollama's placement)"),
], ids=["llama.cpp-fleet", "llama.cpp-split", "ollama"])
def test_job_line_names_the_layer_split_not_tensor_parallelism(args, words):
    """llama.cpp splits whole layers over its GPUs (common/arg.cpp: --split-mode default layer; -ts each GPU's share,
    else by free memory): the job line says so in its words, never "tp 2", which llama.cpp does not run."""
    out = subprocess.run([sys.executable, "-m", "memest", "hf", "meta-llama/Llama-3.1-8B", *args], capture_output=True,
                         text=True, env=ENV, timeout=120)
    assert out.returncode in (0, 3), out.stderr
    job = " ".join(" ".join(out.stdout.split()).split("Job ", 1)[1].split("Device ", 1)[0].split())
    assert words in job and "tp 2" not in job, job


def test_one_gpu_and_other_engines_keep_their_words():
    """One GPU: no split to name; vLLM's tp is tensor parallelism: layout_words leaves it to the tp setting."""
    from memest.workload import Parallelism
    assert ServingConfig(engine=Engine.LLAMACPP).layout_words() is None
    assert ServingConfig(engine=Engine.VLLM, parallelism=Parallelism(tp=2)).layout_words() is None
    assert ServingConfig(engine=Engine.LLAMACPP).layout_words(Parallelism(tp=3)) == (
        "split-mode layer over 3 GPUs, tensor-split by free memory")


def test_fix_offers_layers_in_ram_and_a_smaller_file_on_one_card():
    """Llama-3.1-8B, F16 GGUF, n_ctx 4 x 8,192 = 32,768 cells on one L4 (usable 0.9 x 22.49 = 20.24 GiB):
    it is over by less than 150 MiB (the verdict). Leaving the output layer in RAM (-ngl 32 of 33: 32 blocks +
    output) frees its f16 weight, 128,256 x 4,096 x 2 B = 1,002 MiB, so 32 layers fit on the one card, lossless
    and slower; every layer on the GPU fits as Q8_0 (34 B per 32 weights: 8.03 B x 34 / 32 = 7.95 GiB of
    weights + 32,768 cells x 32 layers x 2 x 8 x 128 x 2 B = 4 GiB of KV, under 20.24 GiB less the buffers).
    Both keep one L4, so a second card (the planner's --gpus 2) is never the cheapest fit."""
    from memest.devices import get_device
    from memest.planning.recommend import assess
    from memest.sources import load_model

    l4 = get_device("L4")
    spec = load_model("meta-llama/Llama-3.1-8B")
    s = ServingConfig(engine=Engine.LLAMACPP, max_model_len=8192, batch_size=4)
    a = assess(spec, s, l4)
    assert not a.verdict.fits and -a.verdict.margin_bytes < 150 * MiB
    assert 128_256 * 4_096 * 2 > 1_000 * MiB > 150 * MiB
    rec = a.recommendation
    assert rec.cheapest.flags == "--n-gpu-layers 32" and rec.cheapest.devices == 1 and rec.cheapest.lossless
    assert "1 of 33 layers in host RAM" in rec.cheapest.changes[0].how and "slower" in rec.cheapest.changes[0].how
    assert rec.lossless is rec.cheapest  # lossless at the same price: the cheapest fit
    assert rec.on_device.flags == "--quantization q8_0" and rec.on_device.devices == 1 and not rec.on_device.lossless
    assert rec.on_device.verdict.fits and rec.on_device.workload.n_gpu_layers is None


def test_fix_on_more_cards_names_the_layer_split_not_tp():
    """Llama-3.1-70B, F16 GGUF: 70.6 B x 2 B = 131.5 GiB of weights. On L4s (20.24 GiB usable each) every layer
    on the GPUs takes more than 131.5 / 20.24 = 6.5 cards, so 8 (the planner's powers of two); no file type of the
    ladder fits one card (Q2_K is 2.96 GB per 8.03 B params at Llama-3-8B, llama-quantize: 26 GB at 70.6 B). The
    fix with every layer on the GPUs is --gpus 8, said as llama.cpp splits it (--split-mode layer), never --tp."""
    out = subprocess.run([sys.executable, "-m", "memest", "hf", "meta-llama/Llama-3.1-70B", "--serve", "--engine",
                          "llama.cpp", "--gpu", "L4", "--max-model-len", "8192"], capture_output=True, text=True,
                         env={**ENV, "COLUMNS": "400"}, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("Every layer on the GPUs:"))
    assert line.startswith("Every layer on the GPUs: --gpus 8 → ") and "--tp" not in line
    assert "split-mode layer over 8 GPUs" in line
    cheapest = next(x for x in out.stdout.splitlines() if x.startswith("Cheapest fit:"))
    assert "--n-gpu-layers" in cheapest and "layers in host RAM" in cheapest and "on 1 × L4" in cheapest
