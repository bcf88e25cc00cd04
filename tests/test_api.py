"""The Python API (README "Python API"): the CLI's answers as functions, its defaults and checks, one
declaration per setting."""

from __future__ import annotations

import doctest
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import memest
from memest.cli import app
from memest.cli.options import WORKLOAD_OPTIONS
from memest.workload import Framework, FsdpStrategy
from memest.workload.settings import settings

README = Path(__file__).resolve().parent.parent / "README.md"


def cli_json(*args: str) -> dict:
    out = CliRunner().invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


# ---- the README section runs as shown ----


def test_readme_python_api_section_runs_as_a_doctest():
    text = README.read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks and ">>> import memest" in blocks[0]
    test = doctest.DocTestParser().get_doctest(blocks[0], {}, "README.md: Python API", str(README), 0)
    assert len(test.examples) >= 8
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


# ---- to_dict() is the CLI's --json ----

JOBS = {
    "train": (("meta-llama/Llama-3.1-8B", "--train", "--gpu", "H100-80GB", "--gpus", "8", "--zero-stage", "3",
               "--micro-batch-size", "2", "--seq-len", "8192"),
              dict(mode="train", gpu="H100-80GB", gpus=8, zero_stage=3, micro_batch_size=2, seq_len=8192)),
    "lora": (("mistralai/Mistral-7B-v0.1", "--finetune", "lora", "--lora-rank", "64", "--lora-targets", "all-linear",
              "--precision", "bf16", "--recompute", "full", "--gpu", "RTX-4090"),
             dict(mode="lora", lora_rank=64, lora_targets="all-linear", precision="bf16", recompute="full",
                  gpu="RTX-4090")),
    "serve": (("meta-llama/Llama-3.1-8B", "--serve", "--max-model-len", "32768", "--batch-size", "16",
               "--kv-cache-dtype", "fp8", "--gpu", "L40S", "--gpus", "2"),
              dict(mode="serve", max_model_len=32768, batch_size=16, kv_cache_dtype="fp8", gpu="L40S", gpus=2)),
}


@pytest.mark.parametrize("name", JOBS)
def test_estimate_to_dict_is_memest_hf_json(name):
    args, kwargs = JOBS[name]
    r = memest.estimate_memory(args[0], **kwargs)
    assert r.to_dict() == cli_json("hf", *args)
    # attributes read the same data
    assert r.fits is r.to_dict()["fits"]
    assert r.per_device.allocated_bytes == r.to_dict()["per_device"]["allocated_bytes"] > 0
    assert r.mode == name


def test_the_settings_reach_the_workload():
    r = memest.estimate_memory(*JOBS["lora"][0][:1], **JOBS["lora"][1])
    w = r.workload
    assert (w.method, w.lora.rank, w.lora.targets, w.precision, w.recompute) == \
        ("lora", 64, "all-linear", "bf16", "full")


def test_plan_to_dict_is_memest_plan_json():
    args = ("meta-llama/Llama-2-7b-hf", "--train", "--micro-batch-size", "4", "--seq-len", "4096",
            "--gpus-available", "8xL4,4xA100-80GB", "--cost", "L4=0.8")
    p = memest.plan_memory("meta-llama/Llama-2-7b-hf", mode="train", micro_batch_size=4, seq_len=4096,
                           gpus_available="8xL4,4xA100-80GB", cost={"L4": 0.8})
    assert p.to_dict() == cli_json("plan", *args)
    assert p.fits and p.fits[0].rank == 1 and p.prices_usd_per_hour.L4 == 0.8


def test_sweep_to_dict_is_memest_sweep_json():
    args = ("meta-llama/Llama-3.1-8B", "--serve", "--batch-size", "1,2,4", "--gpu", "H100")
    s = memest.sweep_memory("meta-llama/Llama-3.1-8B", mode="serve", batch_size=[1, 2, 4], gpu="H100")
    assert s.to_dict() == cli_json("sweep", *args)
    assert memest.sweep_memory("meta-llama/Llama-3.1-8B", mode="serve", batch_size="1,2,4", gpu="H100").to_dict() \
        == s.to_dict()
    assert (s.setting, [p.value for p in s.points]) == ("batch_size", [1, 2, 4])


# ---- the CLI's defaults and checks, from Python ----


def test_a_python_caller_gets_the_cli_defaults():
    # serving tp = gpus / (pp x dp) = 4 / (1 x 1)
    assert memest.estimate_memory("meta-llama/Llama-2-7b-hf", gpus=4).workload.parallelism.tp == 4
    # training seq_len = min(2048, max_position_embeddings): GPT-2 has 1024 positions, Llama-3.1 131,072
    assert memest.estimate_memory("openai-community/gpt2", mode="train").workload.seq_len == 1024
    assert memest.estimate_memory("meta-llama/Llama-3.1-8B", mode="train").workload.seq_len == 2048
    # --fsdp hybrid_shard = ZeRO-3 under FSDP, sharded within a node: 16 H100s at 8 per node -> dp 16,
    # dp_shard gcd(16, 8 / (tp x pp)) = 8
    w = memest.estimate_memory("meta-llama/Llama-3.1-8B", mode="train", gpu="H100", gpus=16,
                               fsdp=FsdpStrategy.HYBRID_SHARD.value).workload
    par = w.parallelism
    assert (w.framework, par.zero_stage, par.dp, par.dp_shard) == (Framework.FSDP, 3, 16, 8)


@pytest.mark.parametrize(("kwargs", "field", "message"), [
    (dict(mode="train", seq_len=0), "seq_len", "seq_len is 0; it must be a positive integer"),
    (dict(mode="serve", seq_len=4096), "seq_len",
     "seq_len is a training flag (tokens per training sequence); for serving use max_model_len"),
    (dict(mode="train", sequence_parallel=True), "sequence_parallel", "sequence_parallel needs tp > 1"),
    (dict(mode="train", precision="fp64"), "precision", "precision 'fp64' is not one of mixed, fp16"),
    (dict(mode="train", micro_batch_size="2"), "micro_batch_size", "micro_batch_size '2' is not an integer"),
    (dict(mode="fly"), "mode", "mode 'fly' is not one of train, lora, qlora, serve"),
    (dict(mode="train", microbatch=2), "microbatch", "unknown setting 'microbatch'"),
    (dict(train=True), "train", "pass the mode as mode="),
    (dict(mode="train", lora_rank=8), "lora_rank", "lora_rank applies to mode lora or mode qlora, not mode='train'"),
])
def test_bad_input_raises_input_error_naming_the_keyword(kwargs, field, message):
    with pytest.raises(memest.InputError) as info:
        memest.estimate_memory("meta-llama/Llama-3.1-8B", **kwargs)
    assert message in str(info.value) and "--" not in str(info.value)
    assert info.value.field == field


def test_the_cli_names_every_setting_of_a_message_by_its_flag():
    out = CliRunner().invoke(app, ["hf", "meta-llama/Llama-3.1-8B", "--serve", "--batch-size", "8", "--max-num-seqs",
                                   "4"])
    assert str(out.exception).endswith("raise --max-num-seqs or lower --batch-size")
    with pytest.raises(memest.InputError, match="raise max_num_seqs or lower batch_size$"):
        memest.estimate_memory("meta-llama/Llama-3.1-8B", batch_size=8, max_num_seqs=4)


def test_the_cli_names_the_same_error_by_its_flag():
    out = CliRunner().invoke(app, ["hf", "meta-llama/Llama-3.1-8B", "--serve", "--seq-len", "4096"])
    assert isinstance(out.exception, memest.InputError) and out.exception.field == "seq_len"
    assert str(out.exception) == "--seq-len is a training flag (tokens per training sequence); for serving use " \
                                 "--max-model-len"


# ---- one declaration per setting ----


def test_every_cli_workload_flag_is_a_declared_setting():
    assert list(WORKLOAD_OPTIONS) == list(settings())
    for name, s in settings().items():
        assert s.help and s.group in ("model", "training", "serving", "parallelism"), name
        if s.scope != "all":
            assert s.what, name  # the refusal says what the flag sets
        assert WORKLOAD_OPTIONS[name][1] == s.default, name


def test_import_memest_stays_light():
    code = ("import sys, memest; memest.estimate_memory; "
            "print(' '.join(m for m in ('torch', 'transformers', 'huggingface_hub', 'typer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ---- flags that were silently ignored (issue 11, section 6) ----

@pytest.mark.parametrize(("args", "message"), [
    (("plan", "meta-llama/Llama-3.1-8B", "--serve", "--global-batch-size", "64"),
     "--global-batch-size is the sequences per optimizer step of a training plan"),
    (("plan", "meta-llama/Llama-3.1-8B", "--serve", "--allow-offload"),
     "--allow-offload lets a training plan try CPU offload"),
    (("calibrate", "meta-llama/Llama-3.1-8B", "--case-timeout", "60"), "--case-timeout 60 applies to --suite runs"),
    (("hf", "meta-llama/Llama-3.1-8B", "--revision", "main"),
     "--revision 'main' needs the Hub, and the Hub is offline (HF_HUB_OFFLINE)"),
    # 2048m = 2^31 > 2^31 - 1, which `memest hf --seq-len` refuses too
    (("sweep", "meta-llama/Llama-3.1-8B", "--train", "--seq-len", "1k..2048m:x2"),
     "--seq-len '1k..2048m:x2' reaches 2,147,483,648, beyond anything memest can size (at most 2,147,483,647"),
])
def test_a_flag_the_job_would_not_read_is_refused(args, message):
    out = CliRunner().invoke(app, list(args))
    assert isinstance(out.exception, memest.InputError), out.output
    assert message in str(out.exception)


def test_hf_refuses_the_value_the_sweep_refuses():
    out = CliRunner().invoke(app, ["hf", "meta-llama/Llama-3.1-8B", "--train", "--seq-len", str(2**31)])
    assert isinstance(out.exception, memest.InputError) and "at most 2,147,483,647" in str(out.exception)


def test_the_functions_list_every_setting_keyword():
    import inspect

    for func in (memest.estimate_memory, memest.plan_memory, memest.sweep_memory):
        params = inspect.signature(func).parameters
        assert set(settings()) - {"train", "finetune", "serve"} <= set(params), func.__name__
        assert params["precision"].default is None and params["seq_len"].default is None  # None: the stack's recipe


def test_a_config_given_as_data_is_the_model_it_describes():
    """The catalog's Llama-3.1-8B config.json passed as a dict: the catalog model's terms, named config.json,
    with no place to load model code from; a Hub revision makes no sense for it."""
    import json
    from pathlib import Path

    path = Path(memest.__file__).parent / "catalog" / "meta-llama" / "Llama-3.1-8B" / "config.json"
    cfg = json.loads(path.read_text())
    given = memest.estimate_memory(cfg, mode="serve", gpu="L4")
    named = memest.estimate_memory("meta-llama/Llama-3.1-8B", mode="serve", gpu="L4")
    assert given.to_dict()["terms"] == named.to_dict()["terms"] and given.model.name == "config.json" and given.config.code_from is None
    assert memest.plan_memory(cfg, gpus_available="2xL4").fits[0].command.startswith("memest hf config.json ")
    with pytest.raises(memest.InputError, match="revision"):
        memest.estimate_memory(cfg, revision="main")


def test_check_logs_takes_texts_never_paths():
    """memest.check_logs reads the texts it is given (one, a list named <log N>, or a name -> text mapping) and no
    file: a path given in place of a text is read as text (no format) and refused; the figures are the log's own
    ('GPU KV cache size: 476,016 tokens' in the vLLM 0.19 fixture of tests/test_check.py)."""
    log = Path(__file__).resolve().parent / "data" / "logs" / "vllm019_llama31_8b_h100_16384.log"
    one = memest.check_logs(log.read_text())
    assert [c.log for c in one] == ["<log>"] and isinstance(one[0], memest.LogCheck)
    tokens = next(f for f in one[0].to_dict()["figures"] if f["figure"] == "kv_cache_tokens")
    assert tokens["logged"] == 476_016
    assert [c.log for c in memest.check_logs([log.read_text(), log.read_text()])] == ["<log 1>", "<log 2>"]
    assert [c.log for c in memest.check_logs({"a.log": log.read_text()})] == ["a.log"]
    with pytest.raises(memest.InputError, match="is not a start-up or training log memest reads"):
        memest.check_logs(str(log))
    with pytest.raises(memest.InputError, match="not a log's text"):
        memest.check_logs([log])
    with pytest.raises(memest.InputError, match="no log given"):
        memest.check_logs([])


@pytest.mark.parametrize(("logs", "named"), [(None, "logs is None;"), (42, "logs is of type int"),
                                              (b"INFO ...", "logs is of type bytes (decode it first")])
def test_check_logs_of_no_text_names_the_argument(logs, named):
    """None, a number, undecoded bytes: an InputError naming the argument and what it takes, not Python's
    TypeError (None and 42 are not iterable) nor one refusal per byte."""
    with pytest.raises(memest.InputError) as exc:
        memest.check_logs(logs)
    message = str(exc.value)
    assert message.startswith(named) and "a log's text (a string)" in message and "\n" not in message


def test_plan_defaults_are_plan_memorys_own_keywords():
    """PLAN_DEFAULTS (what the CLI's plan path fills) and plan_memory's signature (what the web schema reads:
    memest.web.schema.own_keywords) name the same planner keywords at the same defaults; compare_engines is
    what engine='any' sets, no keyword."""
    import inspect

    from memest.api import PLAN_DEFAULTS
    from memest.workload.settings import settings

    own = {n: p.default for n, p in inspect.signature(memest.plan_memory).parameters.items()
           if p.kind is inspect.Parameter.KEYWORD_ONLY and n != "mode" and n not in settings()}
    assert own == {n: v for n, v in PLAN_DEFAULTS.items() if n != "compare_engines"}
