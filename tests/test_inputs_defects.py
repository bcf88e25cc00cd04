"""Defects found by trying bad input (issue 11, section 6): each test reproduces one defect.

Every bad input is one line on stderr with exit code 2 and no traceback; nothing hangs; nothing
written is half-written; remote code runs only from the folder the user named, and only with the flag.
Most tests call the CLI's error boundary (``memest.cli.main``) in-process; the few that need a fresh
interpreter (remote code, which transformers caches per process; file-size limits; signals) use a
subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_LLAMA as TINY  # 2 layers, hidden 64: 202,048 parameters (derived there)
from inprocess import run_memest

from memest import cli

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "MEMEST_DEBUG")} | {"HF_HUB_OFFLINE": "1",
                                                                                     "PYTHONPATH": str(ROOT)}


def memest(*argv: str) -> tuple[int, str, str]:
    """Run ``memest ARGV`` through the CLI's error boundary in this process: (exit code, stdout, stderr)."""
    result = run_memest(*argv, env=ENV)
    return result.returncode, result.stdout, result.stderr


def refused(*argv: str) -> str:
    """The one-line message of a refused input (exit code 2, no traceback): stderr holds that line only (a model
    refused before any meta-device build gets no "building ... on the meta device" notice either)."""
    code, out, err = memest(*argv)
    assert code == 2, (code, out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err and "unexpectedly" not in err, err
    return lines[0]


def write_config(folder: Path, raw: dict, name: str = "config.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(raw))
    return path


# ---- remote code comes only from the folder named ------------------------------------------------

_REMOTE_CONFIG = """
from pathlib import Path
Path({marker!r}).write_text("imported")
from transformers import LlamaConfig
class RemoteConfig(LlamaConfig):
    model_type = "memest_remote_test"
"""
_REMOTE_MODEL = """
from transformers import LlamaForCausalLM
from .configuration_remote import RemoteConfig
class RemoteForCausalLM(LlamaForCausalLM):
    config_class = RemoteConfig
"""


def _remote_folder(folder: Path, marker: Path) -> None:
    raw = dict(TINY, model_type="memest_remote_test", architectures=["RemoteForCausalLM"],
               auto_map={"AutoConfig": "configuration_remote.RemoteConfig",
                         "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"})
    write_config(folder, raw)
    (folder / "configuration_remote.py").write_text(_REMOTE_CONFIG.format(marker=str(marker)))
    (folder / "modeling_remote.py").write_text(_REMOTE_MODEL)


@pytest.mark.slow
def test_remote_code_runs_from_the_named_folder_not_the_cwd(tmp_path):
    # /tmp/x/named/remote is the folder the user names; /tmp/x/cwd/remote is a decoy of the same base
    # name in the working directory. Only the named folder's configuration_remote.py may run.
    named, decoy = tmp_path / "named" / "remote", tmp_path / "cwd" / "remote"
    _remote_folder(named, tmp_path / "named.marker")
    _remote_folder(decoy, tmp_path / "decoy.marker")
    env = ENV | {"HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run([sys.executable, "-m", "memest", "hf", str(named), "--trust-remote-code", "--json"],
                          cwd=tmp_path / "cwd", capture_output=True, text=True, env=env, timeout=300)
    assert not (tmp_path / "decoy.marker").exists(), proc.stderr[-2000:]
    assert (tmp_path / "named.marker").exists(), proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    # no transformers warnings (torch_dtype deprecation) unless MEMEST_DEBUG=1; the one line saying the spec is
    # built on the meta device (issue 12 item 3's notice) is all stderr holds
    assert all(line.startswith("no analytic adapter for model_type") for line in proc.stderr.splitlines()), proc.stderr
    # built from the named folder's classes (a LlamaForCausalLM): the 202,048 parameters of tests/conftest.py's
    # TINY_LLAMA, derived there by hand
    assert json.loads(proc.stdout)["model"]["num_params"] == 202_048


def test_remote_code_never_runs_without_the_flag(tmp_path, monkeypatch):
    named = tmp_path / "remote"
    _remote_folder(named, tmp_path / "named.marker")
    monkeypatch.chdir(tmp_path)
    message = refused("hf", str(named))
    assert "--trust-remote-code" in message
    assert not (tmp_path / "named.marker").exists()


# ---- a calibration record is written whole or not at all ------------------------------------------

_APPEND_UNDER_LIMIT = """
import resource, sys
from pathlib import Path
from memest.calibration.records import append_record
from memest.errors import InputError
path = Path(sys.argv[1])
limit = path.stat().st_size + 40  # room for 40 bytes of a record that is longer than 100
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    append_record(path, {"id": "b", "pad": "x" * 100})
except InputError as exc:
    print(exc)
    sys.exit(2)
"""


def test_a_short_write_leaves_no_partial_record(tmp_path):
    from memest.calibration.records import append_record, read_records

    path = tmp_path / "cpu.jsonl"
    append_record(path, {"id": "a"})
    before = path.read_bytes()
    # the file-size limit stops the write after 40 of its ~120 bytes (Python ignores SIGXFSZ, so the
    # write returns short and the next one fails with EFBIG)
    proc = subprocess.run([sys.executable, "-c", _APPEND_UNDER_LIMIT, str(path)], capture_output=True, text=True,
                          env=ENV, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "could not append" in proc.stdout and "left as it was" in proc.stdout
    assert path.read_bytes() == before
    append_record(path, {"id": "c"})
    assert [r["id"] for _, r in read_records([path])] == ["a", "c"]


def test_a_cut_record_is_skipped_and_reported_and_the_next_is_not_glued_to_it(tmp_path):
    from memest.calibration.records import BadRecordLine, append_record, read_records

    path = tmp_path / "cpu.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b", "pad": "xx')  # an older memest's record cut by a full disk
    append_record(path, {"id": "c"})
    with pytest.warns(BadRecordLine, match="line 2 is not valid JSON"):
        ids = [r["id"] for _, r in read_records([path])]
    assert ids == ["a", "c"]


# ---- calibrate checks every input before the run and never loses a measurement --------------------

TINY_FOLDER = str(ROOT / "calibrate" / "models" / "tiny-llama")  # max_position_embeddings 1024, no weights


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if calibrate starts measuring."""
    from memest.calibration import runner

    def run(*args, **kwargs):
        raise AssertionError("calibrate started the run before refusing its input")

    monkeypatch.setattr(runner, "run", run)


@pytest.mark.usefixtures("no_run")
def test_calibrate_refuses_a_bad_headroom_before_the_run(tmp_path):
    message = refused("calibrate", TINY_FOLDER, "--device", "cpu", "--train", "--seq-len", "32",
                      "--headroom", "1.5", "--results-dir", str(tmp_path))
    assert "--headroom 1.5" in message


@pytest.mark.usefixtures("no_run")
def test_calibrate_refuses_an_unwritable_results_dir_before_the_run(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    message = refused("calibrate", TINY_FOLDER, "--device", "cpu", "--train", "--seq-len", "32",
                      "--results-dir", str(not_a_folder / "results"))
    assert str(not_a_folder / "results") in message and "--results-dir" in message


@pytest.mark.slow
def test_calibrate_prints_the_measurement_it_cannot_record(tmp_path, monkeypatch):
    from memest.calibration import records
    from memest.errors import InputError

    def append_record(path, record):
        raise InputError(f"could not append the calibration record to {str(path)!r} (No space left on device)")

    monkeypatch.setattr(records, "append_record", append_record)
    code, out, err = memest("calibrate", TINY_FOLDER, "--device", "cpu", "--train", "--seq-len",
                            "32", "--results-dir", str(tmp_path), "--json")
    assert code == 2, err
    assert json.loads(out)["measured"][0]["peak_allocated_bytes"] > 0  # the measurement, printed
    last = err.strip().splitlines()[-1]
    assert last.startswith("Error: could not append") and "was not recorded" in last


# ---- ZeRO stages 2 and 3 calibrate on the CPU ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["2", "3"])
def test_cpu_calibration_of_zero_stages_runs(stage):
    # FSDP2 (ZeRO 2/3) makes the parameters, and the fp32 masters copied from them, DTensors: wrappers
    # without a storage of their own, whose storage pointer cannot be read (the local shard's can)
    code, out, err = memest("calibrate", TINY_FOLDER, "--device", "cpu", "--no-record", "--train",
                            "--zero-stage", stage, "--seq-len", "64", "--json")
    assert code == 0, err[-3000:]
    rec = json.loads(out)
    assert rec["inputs"]["workload"]["parallelism"]["zero_stage"] == int(stage)
    assert rec["measured"][0]["peak_allocated_bytes"] > 0
    # the profiler's categories do not see DTensor parameters: the rows compare the storages the job
    # holds. Mixed precision AdamW: bf16 weights 2 B per parameter; fp32 master 4 B + exp_avg 4 B +
    # exp_avg_sq 4 B = 12 B per parameter, so the states are 6 x the weights (one process: no sharding)
    measured = {row["name"]: row["measured"] for row in rec["comparison"]["ranks"][0]["rows"]}
    assert measured["weights"] > 0
    assert measured["optimizer_states"] / measured["weights"] == pytest.approx(6, rel=0.01)


# ---- malformed configs: one line, exit 2 (never a crash, never accepted) --------------------------


def _quantized(**q):
    return dict(TINY, quantization_config=q)


def _params(**fields):
    return {"dim": 512, "n_layers": 2, "n_heads": 8, "vocab_size": 1000} | fields


BAD_CONFIGS = [
    # (id, config.json or params.json contents, a fragment the message must hold)
    ("gptq-bits-word", _quantized(quant_method="gptq", bits="four"), "quantization_config.bits is 'four'"),
    ("gptq-bits-null", _quantized(quant_method="gptq", bits=None), "quantization_config.bits is None"),
    ("gptq-bits-negative", _quantized(quant_method="gptq", bits=-4), "quantization_config.bits is -4"),
    ("gptq-bits-zero", _quantized(quant_method="gptq", bits=0), "quantization_config.bits is 0"),
    ("gptq-group-zero", _quantized(quant_method="gptq", bits=4, group_size=0), "quantization_config.group_size"),
    ("fp8-block-one", _quantized(quant_method="fp8", weight_block_size=[128]), "weight_block_size is [128]"),
    ("fp8-block-int", _quantized(quant_method="fp8", weight_block_size=128), "weight_block_size is 128"),
    ("fp8-block-zero", _quantized(quant_method="fp8", weight_block_size=[0, 0]), "weight_block_size[0] is 0"),
    ("skip-int", _quantized(quant_method="fp8", modules_to_not_convert=5), "modules_to_not_convert is 5"),
    ("ct-groups-list", _quantized(quant_method="compressed-tensors", config_groups=[{"weights": {"num_bits": 4}}]),
     "config_groups is a JSON list"),
    ("meta-multiple-of-zero", _params(multiple_of=0), "'multiple_of' is 0"),
    ("meta-multiple-of-word", _params(multiple_of="x"), "'multiple_of' is 'x'"),
    ("meta-ffn-word", _params(ffn_dim_multiplier="x"), "'ffn_dim_multiplier' is 'x'"),
    ("meta-ffn-nan", _params(ffn_dim_multiplier=float("nan")), "'ffn_dim_multiplier' is nan"),
    ("meta-dim-string", _params(dim="512"), "'dim' is '512'"),
    ("meta-dim-infinite", _params(dim=float("inf")), "'dim' is inf"),
    ("meta-dim-fraction", _params(dim=512.7), "'dim' is 512.7"),
    ("size-1e18", dict(TINY, hidden_size=10**18), "'hidden_size' is 1000000000000000000; memest accepts at most"),
    ("layers-1e9", dict(TINY, num_hidden_layers=10**9), "'num_hidden_layers' is 1000000000; memest accepts at most"),
    ("mlp-only-layers-int", dict(TINY, model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], num_experts=4,
                                 num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                                 mlp_only_layers=5), "'mlp_only_layers' is 5"),
    ("rope-theta-word", dict(TINY, rope_theta="x"), "'rope_theta' is 'x'"),
    ("rope-theta-negative", dict(TINY, rope_theta=-1), "'rope_theta' is -1"),
    ("rope-scaling-int", dict(TINY, rope_scaling=5), "'rope_scaling' is 5"),
    ("rope-scaling-factor", dict(TINY, rope_scaling={"rope_type": "linear", "factor": "two"}),
     "'rope_scaling.factor' is 'two'"),
    ("layer-types-int", dict(TINY, layer_types=5), "'layer_types' is 5"),
    ("layer-types-short", dict(TINY, layer_types=["full_attention"]), "'layer_types' must list 2 entries"),
]


@pytest.mark.parametrize(("raw", "fragment"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_a_malformed_config_is_refused_in_one_line(raw, fragment, tmp_path):
    name = "params.json" if "dim" in raw else "config.json"
    write_config(tmp_path / "model", raw, name)
    assert fragment in refused("hf", str(tmp_path / "model"))


def test_a_model_above_the_parameter_bound_is_refused(tmp_path):
    # every size within 2^31, but 1,000 layers x 3 x (2^20 x 2^24) MLP weights = 5.3e16 parameters > 1e14
    write_config(tmp_path / "model", dict(TINY, hidden_size=2**20, intermediate_size=2**24, num_hidden_layers=1000,
                                          num_attention_heads=2**10, num_key_value_heads=2**10))
    message = refused("hf", str(tmp_path / "model"))
    assert "parameters, more than memest's bound of 1e+14" in message


BAD_FILES = [
    # (id, the bytes of config.json, a fragment the message must hold)
    ("deep-json", b"[" * 100_000 + b"]" * 100_000, "nests lists or objects too deeply"),
    ("deep-object", b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}", "more than 64 levels deep"),
    ("5000-digit-int", json.dumps(TINY).replace('"vocab_size": 1000', '"vocab_size": ' + "1" * 5000).encode(),
     "holds a number too long to read"),
    ("10^400", json.dumps(TINY).replace('"vocab_size": 1000', '"vocab_size": 1e400').encode(), "'vocab_size' is inf"),
    ("binary", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is a binary file, not a JSON config"),
    ("latin-1", '{"model_type": "llama", "name": "café"}'.encode("latin-1"), "is not UTF-8 text (byte 0xe9"),
]


@pytest.mark.parametrize(("data", "fragment"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_a_bad_config_file_is_refused_in_one_line(data, fragment, tmp_path):
    (tmp_path / "config.json").write_bytes(data)
    assert fragment in refused("hf", str(tmp_path / "config.json"))


def test_an_over_long_file_name_is_refused(tmp_path):
    long = str(tmp_path / ("a" * 300))  # NAME_MAX is 255 on Linux file systems
    assert "File name too long" in refused("hf", long)


def _dangling(folder: Path) -> None:
    (folder / "config.json").symlink_to(folder / "gone.json")


def _directory(folder: Path) -> None:
    (folder / "config.json").mkdir()


def _fifo(folder: Path) -> None:
    os.mkfifo(folder / "config.json")  # opening it for reading would block until a writer comes


@pytest.mark.parametrize(("make", "fragment"), [(_dangling, "is a dangling symlink (to "),
                                                (_directory, "is a directory, not a config file"),
                                                (_fifo, "is a FIFO (named pipe), not a config file")],
                         ids=["dangling-symlink", "directory", "fifo"])
def test_a_config_json_that_is_not_a_file_says_what_it_is(make, fragment, tmp_path):
    make(tmp_path)
    assert fragment in refused("hf", str(tmp_path))


def test_a_character_device_is_refused_without_reading_it():
    assert "'/dev/zero' is a character device" in refused("hf", "/dev/zero")


# ---- calibrate and plan refuse what would hang or crash, before any work -------------------------


@pytest.mark.usefixtures("no_run")
@pytest.mark.parametrize(("args", "fragment"), [
    (("--steps", "2147483648"), "--steps is 2147483648; it must be between 1 and 1,000"),
    # tiny-llama has max_position_embeddings 1024 (calibrate/models/tiny-llama/config.json)
    (("--seq-len", "100000"), "--seq-len 100,000 is beyond the 1,024 positions of tiny-llama"),
    # the folder holds only config.json
    (("--weights",), "holds no weight files"),
], ids=["steps-2^31", "seq-len-beyond-positions", "weights-without-weights"])
def test_calibrate_refuses_before_the_run(args, fragment):
    message = refused("calibrate", TINY_FOLDER, "--device", "cpu", "--train", "--no-record", *args)
    assert fragment in message


def test_calibrate_refuses_a_suite_that_is_a_json_list(tmp_path):
    (tmp_path / "suite.json").write_text("[1, 2]")
    message = refused("calibrate", "--suite", str(tmp_path / "suite.json"))
    assert "must be a JSON object with a 'cases' list" in message


@pytest.mark.parametrize(("make", "fragment"), [
    (lambda d: d, "is a directory"),
    (lambda d: (d / "prices.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe") and d / "prices.bin",
     "is not UTF-8 text"),
], ids=["directory", "binary"])
def test_plan_costs_refuses_what_is_not_a_price_file(make, fragment, tmp_path):
    message = refused("plan", TINY_FOLDER, "--train", "--costs", str(make(tmp_path)))
    assert fragment in message


def test_quantizing_an_already_quantized_checkpoint_is_refused():
    # DeepSeek-V3's checkpoint is fp8 (quantization_config quant_method "fp8", weight_block_size [128, 128])
    message = refused("hf", "deepseek-ai/DeepSeek-V3", "--serve", "--quantization", "int4")
    assert "--quantization int4" in message and "already quantized (fp8" in message


def test_the_checkpoints_own_quantization_may_be_named():
    code, _, err = memest("hf", "deepseek-ai/DeepSeek-V3", "--serve", "--quantization", "fp8",
                          "--gpus", "8", "--json")
    assert code == 0, err


# ---- messages --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "value"), [("--seq-len", "abc"), ("--headroom", "ten"), ("--micro-batch-size", "1.5")])
def test_a_non_numeric_flag_value_is_echoed(flag, value):
    message = refused("hf", "meta-llama/Llama-2-7b-hf", "--train", flag, value)
    assert f"{value!r}" in message and flag in message


def test_ctrl_c_prints_one_interrupted_line(monkeypatch):
    from memest import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "estimate_values", interrupted)
    code, out, err = memest("hf", "meta-llama/Llama-2-7b-hf", "--train")
    assert (code, out, err) == (130, "", "Interrupted.\n")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.2, 2.0], ids=["while-starting", "while-tracing"])
def test_sigint_prints_one_interrupted_line(delay):
    import signal
    import time

    # the trace of Llama-3.1-8B imports torch and transformers and runs ~10,000 operators: several seconds
    proc = subprocess.Popen([sys.executable, "-m", "memest", "hf", "meta-llama/Llama-3.1-8B", "--train", "--trace"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (130, "Interrupted.\n"), err[-2000:]


@pytest.mark.slow
def test_cpu_calibration_prints_no_profiler_lines(monkeypatch, capfd):
    # kineto writes "USDT: ... profiler_start" / "profiler_stop" to file descriptor 2 around every step
    monkeypatch.setattr(sys, "argv", ["memest", "calibrate", TINY_FOLDER, "--device", "cpu", "--no-record", "--train",
                                      "--seq-len", "32", "--steps", "2", "--json"])
    monkeypatch.delenv("MEMEST_DEBUG", raising=False)
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code
    out, err = capfd.readouterr()
    assert code in (0, None), err
    assert json.loads(out)["outcome"] == "ok"
    noise = [line for line in err.splitlines() if line.startswith(("USDT:", "STAGE:")) or "[transformers]" in line]
    assert noise == []


def test_remote_code_never_comes_from_another_repository_or_a_shadowing_folder(tmp_path, monkeypatch):
    from memest.errors import UnsupportedArchitectureError
    from memest.sources.config import HFConfig
    from memest.sources.meta import _remote_code_location

    raw = {"model_type": "x", "auto_map": {"AutoConfig": "other/repo--configuration_x.XConfig"}}
    named = HFConfig(raw, name="named", source="hub", code_from="org/named")
    with pytest.raises(UnsupportedArchitectureError, match="loads code from another repository"):
        _remote_code_location(named)
    # a Hub id that is also a folder of the working directory: transformers would import the folder's code
    (tmp_path / "org" / "named").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    hub = HFConfig({"model_type": "x", "auto_map": {"AutoConfig": "configuration_x.XConfig"}}, name="org/named",
                   source="hub", code_from="org/named")
    with pytest.raises(UnsupportedArchitectureError, match="names both a Hub repository and a folder"):
        _remote_code_location(hub)
    # a config built in memory comes from nowhere code may be read
    with pytest.raises(UnsupportedArchitectureError, match="not read from a folder or a Hub repository"):
        _remote_code_location(HFConfig(raw, name="mem", source="memory"))
