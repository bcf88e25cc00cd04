"""The web service (memest.web) in-process through Starlette's TestClient: answers equal the Python API's
``to_dict()`` (the CLI's --json), bad input is one line with the right status, requests name no files
and run no code, and ``memest serve`` binds this machine only unless told."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web extra is not installed: pip install 'memest[web]'")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

from starlette.testclient import TestClient  # noqa: E402

import memest  # noqa: E402
from memest.web.app import MAX_BODY_BYTES, create_app  # noqa: E402
from tests.inprocess import run_memest  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B"
CATALOG_CONFIG = Path(memest.__file__).parent / "catalog" / "meta-llama" / "Llama-3.1-8B" / "config.json"


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(), raise_server_exceptions=False) as c:
        yield c


def _one_line_error(r, status):
    assert r.status_code == status, r.text
    body = r.json()
    assert list(body) == ["error"] and "\n" not in body["error"] and "Traceback" not in body["error"]
    return body["error"]


def test_estimate_equals_the_python_api(client):
    settings = {"mode": "serve", "gpu": "L4", "max_model_len": 8192, "batch_size": 4}
    r = client.post("/v1/estimate", json={"model": LLAMA, **settings})
    assert r.status_code == 200
    assert r.json() == memest.estimate_memory(LLAMA, **settings).to_dict()


def test_training_estimate_equals_the_python_api(client):
    settings = {"mode": "train", "gpu": "H100", "gpus": 8, "zero_stage": 3, "seq_len": 4096, "micro_batch_size": 2}
    r = client.post("/v1/estimate", json={"model": LLAMA, **settings})
    assert r.status_code == 200
    assert r.json() == memest.estimate_memory(LLAMA, **settings).to_dict()


def test_plan_and_sweep_equal_the_python_api(client):
    plan = {"mode": "serve", "gpus_available": "4xL4", "max_model_len": 8192}
    assert client.post("/v1/plan", json={"model": LLAMA, **plan}).json() == memest.plan_memory(LLAMA, **plan).to_dict()
    sweep = {"gpu": "L4", "max_model_len": "1k..8k"}  # 1k, 2k, 4k, 8k: four points
    r = client.post("/v1/sweep", json={"model": LLAMA, **sweep})
    assert r.status_code == 200 and r.json() == memest.sweep_memory(LLAMA, **sweep).to_dict()
    r = client.post("/v1/sweep", json={"model": LLAMA, "gpu": "L4", "max_model_len": [1024, 2048, 4096, 8192]})
    assert r.json() == memest.sweep_memory(LLAMA, **sweep).to_dict()


def test_pasted_config_is_the_catalog_model(client):
    """The catalog's own config.json pasted as data gives the catalog model's numbers, named config.json."""
    cfg = json.loads(CATALOG_CONFIG.read_text())
    pasted = client.post("/v1/estimate", json={"config": cfg, "gpu": "L4"}).json()
    named = client.post("/v1/estimate", json={"model": LLAMA, "gpu": "L4"}).json()
    assert pasted["per_device"] == named["per_device"] and pasted["terms"] == named["terms"]
    assert pasted["model"]["name"] == "config.json" and pasted["model"]["source"] == "given data"


def test_bad_setting_is_400_with_the_api_message(client):
    with pytest.raises(memest.InputError) as raised:
        memest.estimate_memory(LLAMA, mode="train", seq_len=0)
    message = _one_line_error(client.post("/v1/estimate", json={"model": LLAMA, "mode": "train", "seq_len": 0}), 400)
    assert message == str(raised.value)
    assert "seq_len" in message and "--seq-len" not in message  # the request's keyword, not the CLI's flag
    assert "unknown model" in _one_line_error(client.post("/v1/estimate", json={"model": "no-such/model-xyz"}), 400)
    # a string of the right JSON type that is no mode's name: the library's rule, so 400
    assert "'fly' is not one of train" in _one_line_error(client.post("/v1/estimate", json={"model": LLAMA,
                                                                                            "mode": "fly"}), 400)


@pytest.mark.parametrize("body", [
    [1, 2],                                               # not an object
    {"model": LLAMA, "seq_len": "4096"},                  # a string for an integer
    {"model": LLAMA, "mode": "train", "micro_batch_size": True},  # a boolean is no integer
    {"model": LLAMA, "enforce_eager": "yes"},             # a string for a boolean
    {"model": 7},                                         # a number for the model
    {"model": LLAMA, "no_such_setting": 1},               # an unknown field
    {"gpu": "L4"},                                        # neither model nor config
    {"model": LLAMA, "config": {}},                       # both
    {"config": "not an object"},
])
def test_wrong_json_types_are_422(client, body):
    _one_line_error(client.post("/v1/estimate", json=body), 422)


def test_body_that_is_not_json_is_422(client):
    _one_line_error(client.post("/v1/estimate", content=b"{not json", headers={"content-type": "application/json"}),
                    422)


def test_body_over_one_megabyte_is_413(client):
    body = b'{"model": "' + b"a" * MAX_BODY_BYTES + b'"}'  # 1 MiB of name, plus the 13 bytes around it
    _one_line_error(client.post("/v1/estimate", content=body), 413)


@pytest.mark.parametrize("model", ["/etc/passwd", "./config.json", "~/models/llama", "memest", "tests",
                                   "config.json", "..\\x", "a/b/c", "C:/models/x"])
def test_a_path_as_model_is_refused(client, model):
    """Absolute, relative and home paths, names of folders in the server's working directory, .json files."""
    message = _one_line_error(client.post("/v1/estimate", json={"model": model}), 400)
    assert "file-system path" in message


@pytest.mark.parametrize("field, value", [("trust_remote_code", True), ("trust_remote_code", False),
                                          ("gguf", "/tmp/x.gguf")])
def test_code_and_files_are_refused(client, field, value):
    assert field in _one_line_error(client.post("/v1/estimate", json={"model": LLAMA, field: value}), 400)


def test_plan_costs_file_is_refused(client):
    assert "costs" in _one_line_error(client.post("/v1/plan", json={"model": LLAMA, "costs": "/etc/passwd"}), 400)


def test_pasted_config_with_remote_code_never_loads_it(client, tmp_path):
    """An auto_map config of an unknown model_type: refused as unsupported (a 400), its code never fetched."""
    cfg = {"model_type": "no_such_family_xyz", "auto_map": {"AutoConfig": "evil.Config"}, "hidden_size": 64}
    r = client.post("/v1/estimate", json={"config": cfg})
    assert r.status_code == 400


def test_models_and_gpus_equal_the_cli(client):
    for command in ("models", "gpus"):
        cli = run_memest(command, "--json")
        assert cli.returncode == 0, cli.stderr
        assert client.get(f"/v1/{command}").json() == json.loads(cli.stdout)


def test_health_docs_and_page(client):
    assert client.get("/v1/health").json() == {"status": "ok", "version": memest.__version__}
    doc = client.get("/openapi.json").json()
    assert set(doc["paths"]) >= {"/v1/estimate", "/v1/plan", "/v1/sweep", "/v1/models", "/v1/gpus", "/v1/health"}
    # every setting keyword the Python API takes appears in the estimate schema (train/finetune/serve as mode)
    props = doc["paths"]["/v1/estimate"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert {"seq_len", "max_model_len", "batch_size", "micro_batch_size", "gpu", "gpus", "mode"} <= set(props)
    assert client.get("/docs").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert "http://" not in page.text and "https://" not in page.text  # no CDN, nothing from the network


def test_no_cors_and_unknown_routes_are_json(client):
    r = client.options("/v1/estimate", headers={"origin": "https://example.com", "access-control-request-method":
                                                "POST"})
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}
    assert client.get("/v1/nope").status_code == 404 and "error" in client.get("/v1/nope").json()


def test_a_request_past_the_time_limit_is_504():
    with TestClient(create_app(timeout_s=1e-9)) as slow:
        _one_line_error(slow.post("/v1/estimate", json={"model": LLAMA}), 504)


def test_command_is_the_hf_line(client):
    r = client.post("/v1/command", json={"model": LLAMA, "gpu": "L4", "max_model_len": 8192, "batch_size": 4})
    # the settings given, as flags in the declaration order (serving's, then the device's)
    assert r.json() == {"command": f"memest hf {LLAMA} --serve --max-model-len 8192 --batch-size 4 --gpu L4"}


def _served(monkeypatch):
    """``uvicorn.Server.run`` recording the address of each socket it is handed (and closing it)."""
    import uvicorn

    calls = []

    def run(self, sockets=None):
        calls.append([s.getsockname()[:2] for s in sockets])
        for s in sockets:
            s.close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    return calls


def test_serve_binds_localhost_unless_told(monkeypatch):
    import inspect

    from memest.cli.serve import serve_command

    calls = _served(monkeypatch)
    assert inspect.signature(serve_command).parameters["port"].default == 8000
    r = run_memest("serve", "--port", "0")
    assert r.returncode == 0, r.stderr
    assert run_memest("serve", "--host", "0.0.0.0", "--port", "0").returncode == 0
    assert [c[0][0] for c in calls] == ["127.0.0.1", "0.0.0.0"]
    # --port 0: the port the system picked, printed as the one to open
    assert r.stderr.strip() == f"memest serving on http://127.0.0.1:{calls[0][0][1]}/ (Ctrl-C stops)"
    assert calls[0][0][1] != 0


def test_serve_on_a_port_in_use_is_one_line_exit_2(monkeypatch):
    import socket

    calls = _served(monkeypatch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_memest("serve", "--port", str(port))
    assert r.returncode == 2 and r.stdout == "" and calls == []
    assert r.stderr.strip() == f"Error: port {port} on 127.0.0.1 is in use; pick another with --port"


def test_serve_answers_on_the_port_it_prints():
    """A real ``memest serve --port 0``: the printed address answers /v1/health."""
    import subprocess
    import time
    import urllib.request

    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "memest", "serve", "--port", "0"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("memest serving on http://127.0.0.1:"), line
        url = line.split()[3]
        for _ in range(100):
            try:
                with urllib.request.urlopen(url + "v1/health", timeout=2) as answer:
                    assert json.load(answer)["status"] == "ok"
                    break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"{url} did not answer")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_without_the_extra_refuses_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn raises ImportError
    r = run_memest("serve")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and "pip install 'memest[web]'" in r.stderr


# the stacks of issue 13, in its order: `--stack hf-trainer | trl | accelerate | torchtune | torchtitan | axolotl |
# llamafactory | unsloth | litgpt | deepspeed | megatron | nemo | fsdp | pytorch`
STACK_NAMES = ["hf-trainer", "trl", "accelerate", "torchtune", "torchtitan", "axolotl", "llamafactory", "unsloth",
               "litgpt", "deepspeed", "megatron", "nemo", "fsdp", "pytorch"]


def test_stacks_are_the_stack_settings_values(client):
    stacks = client.get("/v1/stacks").json()
    assert [s["name"] for s in stacks] == STACK_NAMES
    doc = client.get("/openapi.json").json()
    props = doc["paths"]["/v1/estimate"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert props["stack"]["enum"] == STACK_NAMES and "/v1/stacks" in doc["paths"]
    by_name = {s["name"]: s for s in stacks}
    # issue 13: "HF Trainer 4.5x, bf16=True: fp32 params, autocast bf16, adamw_torch_fused"; torchtune: pure bf16
    assert by_name["hf-trainer"]["bf16"] == "bf16=True"
    assert by_name["hf-trainer"]["recipe"].endswith("bf16=True: fp32 params, autocast bf16, adamw_torch_fused")
    assert "pure bf16" in by_name["torchtune"]["recipe"]


def test_page_names_no_stack_itself(client):
    """The page's stack picker is filled from GET /v1/stacks: neither the page nor its script lists a stack."""
    texts = [client.get(path).text for path in ("/", "/static/app.js", "/static/index.html")]
    for name in STACK_NAMES:
        if name in ("fsdp", "pytorch", "deepspeed", "megatron"):  # words that may appear in prose
            name = f'"{name}"'
        assert not any(name in text for text in texts), name


def test_command_names_the_stack(client):
    r = client.post("/v1/command", json={"model": LLAMA, "mode": "lora", "stack": "torchtune", "gpu": "L4"})
    assert r.json() == {"command": f"memest hf {LLAMA} --finetune lora --stack torchtune --gpu L4"}
    # a serving job reads no stack: refused in one line, as the CLI refuses --stack with --serve
    message = _one_line_error(client.post("/v1/command", json={"model": LLAMA, "stack": "torchtune"}), 400)
    assert message.startswith("stack is a training flag")


def test_sweep_as_the_page_asks_it(client):
    """The page sweeps a slider's whole range (powers of two) with the other settings as they are."""
    body = {"model": LLAMA, "mode": "serve", "gpu": "L4", "batch_size": 1, "max_model_len": "512..128k"}
    s = client.post("/v1/sweep", json=body).json()
    assert [p["value"] for p in s["points"]] == [2**k for k in range(9, 18)]  # 512 .. 131072: nine points
    fits = {p["value"]: p["fits"] for p in s["points"]}
    # 8k context: bf16 weights 8.03e9 x 2 B = 14.96 GiB + 8192 x 128 KiB of KV (2 x 32 layers x 8 kv heads x 128 x
    # 2 B) = 1 GiB, under the L4's 22.49 GiB; 128k: 16 GiB of KV + 14.96 GiB of weights = 31 GiB, over it
    assert fits[8192] and not fits[131072]
    assert 8192 <= s["largest"]["value"] < 131072 and s["device"]["memory_bytes"] == 24152899584  # 22.49 GiB
    # every point's terms add up to its device-used figure: the chart stacks them to the total it draws
    assert all(sum(t["bytes"] for t in p["terms"]) == p["device_used_bytes"] for p in s["points"])
    training = {"model": LLAMA, "mode": "lora", "stack": "torchtune", "gpu": "L4", "seq_len": 4096,
                "micro_batch_size": "1..256"}
    t = client.post("/v1/sweep", json=training).json()
    assert [p["value"] for p in t["points"]] == [2**k for k in range(9)] and t["setting"] == "micro_batch_size"


# ---- POST /v1/check: a pasted log against memest's estimate (memest check --json) ----

LOGS = Path(__file__).resolve().parent / "data" / "logs"
V1_LOG = LOGS / "vllm019_llama31_8b_h100_16384.log"
"""llm-d-incubation/llm-d-planner accuracy/results/v0.19.0/logs/...--16384.log (vLLM 0.19.0, H100 80GB): the
fixture of tests/test_check.py."""
V064_LOG = LOGS / "vllm064_llama31_8b_rtx3090_20k.log"
"""vllm-project/vllm issue #10517 (RTX 3090): names no model."""


def _check_cli(*args):
    import os

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | {"HF_HUB_OFFLINE": "1", "MEMEST_DEBUG": ""}
    return run_memest("check", *args, env=env)


def test_check_equals_memest_check_json(client):
    cli = _check_cli(str(V1_LOG), "--json")
    assert cli.returncode == 0, cli.stderr
    want = json.loads(cli.stdout)
    r = client.post("/v1/check", json={"log": V1_LOG.read_text()})
    assert r.status_code == 200, r.text
    got = r.json()
    assert [g.pop("log") for g in got] == ["log"] and [w.pop("log") for w in want] == [str(V1_LOG)]  # its name
    assert got == want
    # the log's own numbers: 'GPU KV cache size: 476,016 tokens', 'Available KV cache memory: 58.11 GiB'
    figures = {f["figure"]: f for f in got[0]["figures"]}
    assert figures["kv_cache_tokens"]["logged"] == 476_016 and figures["kv_cache_memory"]["logged"] == round(58.11 * 2**30)


def test_check_several_logs_and_settings_as_the_cli(client):
    """Two logs, the second naming no model: given as model and gpu, as --model and --gpu do."""
    cli = _check_cli(str(V064_LOG), "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "RTX-3090",
                     "--setting", "max-num-seqs=64", "--json")
    assert cli.returncode == 0, cli.stderr
    r = client.post("/v1/check", json={"logs": [V064_LOG.read_text()], "model": "meta-llama/Llama-3.1-8B-Instruct",
                                       "gpu": "RTX-3090", "settings": {"max_num_seqs": 64}})
    assert r.status_code == 200, r.text
    got, want = r.json(), json.loads(cli.stdout)
    assert [g.pop("log") for g in got] == ["logs[0]"] and [w.pop("log") for w in want] == [str(V064_LOG)]
    assert got == want


def test_check_bad_input_is_one_line(client):
    unknown = _one_line_error(client.post("/v1/check", json={"log": "hello\nworld\n"}), 400)
    assert "is not a start-up or training log memest reads (formats read: TensorRT-LLM, SGLang, " in unknown
    assert "vLLM (0.6, V1)" in unknown
    assert "pass it with model" in _one_line_error(client.post("/v1/check", json={"log": V064_LOG.read_text()}), 400)
    assert "is empty" in _one_line_error(client.post("/v1/check", json={"log": "  \n"}), 400)
    assert "unknown setting 'no_such'" in _one_line_error(
        client.post("/v1/check", json={"log": V1_LOG.read_text(), "settings": {"no_such": 1}}), 400)
    # the log states max_seq_len=16384: a max_model_len given against it is refused, named by its keyword
    contradicted = _one_line_error(client.post("/v1/check", json={"log": V1_LOG.read_text(),
                                                                  "settings": {"max_model_len": 8192}}), 400)
    assert "the log states max_model_len=16384, and max_model_len gives 8192" in contradicted


def test_check_a_log_with_a_lone_surrogate(client):
    """JSON may carry "\\ud800", which is no character: read as '?', so the
    answer, which quotes the line, can be sent."""
    body = (b'{"log": "vLLM\\nGPU KV cache size: 10 tokens \\ud800", "model": "meta-llama/Llama-3.1-8B", '
            b'"gpu": "H100"}')
    r = client.post("/v1/check", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()[0]["figures"][0]["line"] == "GPU KV cache size: 10 tokens ?"


@pytest.mark.parametrize("settings", [{"config": ["/etc/passwd"]}, {"config": "train.yaml"}, {"gguf": "/tmp/x.gguf"},
                                      {"trust_remote_code": True}])
def test_check_refuses_settings_that_name_files_or_run_code(client, settings):
    message = _one_line_error(client.post("/v1/check", json={"log": V1_LOG.read_text(), "settings": settings}), 400)
    assert message.startswith(f"settings {next(iter(settings))!r} is not taken here")


@pytest.mark.parametrize("body", [
    {"log": 7}, {"log": ["a"]}, {"logs": "text"}, {"logs": [1]},  # not text
    {}, {"log": "x", "logs": ["x"]},                              # neither, both
    {"log": "x", "settings": [1]}, {"log": "x", "settings": {"seq_len": "4096"}},  # a setting of the wrong type
    {"log": "x", "path": "/etc/passwd"}, [1],
])
def test_check_wrong_json_types_are_422(client, body):
    _one_line_error(client.post("/v1/check", json=body), 422)


def test_check_reads_no_file_a_log_or_request_names(client, tmp_path, monkeypatch):
    """A model folder on the server's disk, named by the log (vLLM's model=) or by the request: never opened.
    The same log through the CLI reads the folder (its config.json, a model no catalog holds)."""
    folder = tmp_path / "acme" / "secret-7b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(CATALOG_CONFIG.read_text())
    text = V1_LOG.read_text().replace("'meta-llama/Llama-3.1-8B-Instruct'", f"'{folder}'")
    message = _one_line_error(client.post("/v1/check", json={"log": text}), 400)
    assert "is not in memest's offline catalog" in message
    assert "file-system path" in _one_line_error(client.post("/v1/check", json={"log": text, "model": str(folder)}),
                                                 400)
    log = tmp_path / "engine.log"
    log.write_text(text)
    cli = _check_cli(str(log), "--json")
    assert cli.returncode == 0 and json.loads(cli.stdout)[0]["model"] == "secret-7b"  # the CLI reads the folder


def test_check_body_over_one_megabyte_is_413(client):
    body = json.dumps({"log": "vLLM " + "x" * MAX_BODY_BYTES}).encode()
    _one_line_error(client.post("/v1/check", content=body), 413)


def test_check_is_in_the_openapi_document(client):
    doc = client.get("/openapi.json").json()
    props = doc["paths"]["/v1/check"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert set(props) == {"log", "logs", "model", "gpu", "engine_version", "settings"}


MARKERS = {"TensorRT-LLM": "[TensorRT-LLM] ", "SGLang": "server_args=ServerArgs(", "llama.cpp": "llama_model_loader ",
           "torchtitan": "[titan] ", "torchtune": "torchtune ", "HF Trainer": "before_init_mem_gpu ", "vLLM": "vLLM "}
"""Text each reader detects its format by (memest.logs.<reader>.MARKERS)."""

LEADS = ("total_gpu_memory", "gpu_memory_utilization", "KV Cache is allocated.", "Load weight end.",
         "Memory profiling results:", "Device 0: ", "using device CUDA0 (", "step: 1  loss: 2", "CUDA capacity: ",
         "Building llama3 8B with ModelArgs(", "non-default args: {", "server_args=ServerArgs(", "init_mem_gpu_alloc_delta",
         "Dtype:", "Allocated ", "max_total_num_tokens=")
"""Literals the readers' patterns start from: each repeated, or followed by a long run, is the text a
pattern with a scan repeated from each lead, or with adjacent quantifiers, would take quadratic time on."""


def _hostile(marker: str) -> list[str]:
    n = 200_000
    runs = [marker + filler * (n // len(filler)) for filler in (" ", "(", "0", "\n", "a", "=", " \n", "9,", "{")]
    runs += [marker + (lead + filler) * (n // (len(lead) + 1)) for lead in LEADS for filler in (" ", "0", "\n")]
    runs += [marker + lead + filler * n for lead in LEADS for filler in (" ", "1")]
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("reader", list(MARKERS))
def test_check_answers_hostile_text_in_linear_time(client, reader):
    """200 kB of pathological text per request: each answered, 200 or 400 (never 500), within 2 s."""
    import time

    for text in _hostile(MARKERS[reader]):
        start = time.perf_counter()
        r = client.post("/v1/check", json={"log": text})
        took = time.perf_counter() - start
        assert r.status_code in (200, 400), (text[:60], r.text)
        assert took < 2.0, (reader, text[:60], took)


@pytest.mark.parametrize("line", [
    "GPU KV cache size: 1" + "0" * 400 + " tokens",              # 10**400 tokens
    "GPU KV cache size: " + "9" * 5000 + " tokens",              # past Python's int-from-text limit
    "Available KV cache memory: 1" + "0" * 400 + " GiB",
    "Maximum concurrency for 1" + "0" * 400 + " tokens per request: 2.5x",
    "# GPU blocks: 1" + "0" * 30,                                # 10**30 blocks: beyond any pool (2**62)
])
def test_check_huge_numbers_are_400(client, line):
    message = _one_line_error(client.post("/v1/check", json={"log": f"vLLM\n{line}\n"}), 400)
    assert "too large" in message or "beyond any device" in message


def _leads(module) -> list[str]:
    """The literal text each of a reader's patterns starts with (every string in its source, cut at its first
    regex metacharacter): what a hostile log repeats to make a pattern rescan a line from each copy."""
    import ast

    leads = set()
    for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
        if isinstance(node, ast.JoinedStr):
            node = node.values[0] if node.values else None
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        text, out = node.value, ""
        for i, ch in enumerate(text):
            if ch in ".^$*+?{}[]|()\\":
                if ch == "\\" and i + 1 < len(text) and not text[i + 1].isalnum():
                    continue  # an escaped literal: the next character is kept
                if i and text[i - 1] == "\\":
                    out += ch
                    continue
                break
            out += ch
        if 3 <= len(out) <= 80:
            leads.add(out)
    return sorted(leads)


@pytest.mark.slow
@pytest.mark.parametrize("reader", list(MARKERS))
def test_every_pattern_of_a_reader_is_linear(reader):
    """Each lead of each of the reader's patterns repeated along one 100 kB line, or followed by 20 kB of spaces,
    digits or newlines. A pattern that rescans the rest of the line from each copy of its lead takes k x L steps (2,800
    copies of a 35-character lead x 50 kB on average: 1.4e8, seconds); one that splits a run between two
    quantifiers over the same characters takes n^2 per start (4e8 at 20 kB), as a multi-line ``^\\s*`` does from
each of 20,000 empty lines; a linear one takes milliseconds
    (some 40 patterns x 100 kB). The bounds, 1 s and 0.25 s, are some 20x the linear time."""
    import time

    from memest.errors import MemestError
    from memest.logs import FORMATS, read_log

    module = next(m for label, m in FORMATS.items() if label.startswith(reader))
    marker = MARKERS[reader]
    for lead in _leads(module):
        texts = [(marker + (lead + " ") * (100_000 // (len(lead) + 1)), 1.0),
                 *[(marker + lead + filler * 20_000, 0.25) for filler in (" ", "1", "\n")]]
        for text, bound in texts:
            start = time.perf_counter()
            try:
                read_log(text)
            except MemestError:
                pass
            assert time.perf_counter() - start < bound, (reader, lead, text[len(marker):][:40])


def test_check_one_bad_log_hides_no_other(client):
    """As memest check --json: the logs checked and each failed log's error, status 400 (the CLI exits 2);
    a request whose every log fails keeps the one-line error."""
    r = client.post("/v1/check", json={"logs": [V064_LOG.read_text(), V1_LOG.read_text()]})
    assert r.status_code == 400, r.text
    body = r.json()
    assert list(body) == ["error", "checks", "errors"] and "\n" not in body["error"]
    assert body["error"].startswith("logs[0]: the vLLM V0 log does not name its model; pass it with model")
    assert [c["log"] for c in body["checks"]] == ["logs[1]"]
    assert body["checks"][0] == client.post("/v1/check", json={"logs": ["", V1_LOG.read_text()]}).json()["checks"][0]
    assert [e["log"] for e in body["errors"]] == ["logs[0]"] and body["errors"][0]["error"] == body["error"]
    both = _one_line_error(client.post("/v1/check", json={"logs": [V064_LOG.read_text(), "  \n"]}), 400)
    assert both.endswith("(and 1 more log failed)")


def _keywords(func):
    """Every keyword the Python API function takes (its advertised signature: its own and the settings')."""
    import inspect

    return [n for n, p in inspect.signature(func).parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]


@pytest.mark.parametrize("kind, func", [("estimate", memest.estimate_memory), ("plan", memest.plan_memory),
                                        ("sweep", memest.sweep_memory)])
def test_every_python_keyword_is_a_field_of_its_endpoint(kind, func):
    """The body takes the Python API's keywords, no hand list: each one (but those naming files or running
    code, and the mode settings, given as mode) is a field, and the error of an unknown field lists them all."""
    from memest.web.schema import MODE_FIELDS, REFUSED, SchemaError, fields, parse
    from memest.workload.settings import settings

    taken = [n for n in _keywords(func) if n not in REFUSED and n not in MODE_FIELDS]
    # the settings are advertised in the signature (so this loop reaches them all)
    assert "mode" in taken and set(settings()) - set(MODE_FIELDS) - set(REFUSED) <= set(taken)
    if kind == "plan":  # the planner's own keywords, the reported ones among them
        assert {"top", "allow_optimizer_change", "allow_batch_reshape", "host_memory", "cost"} <= set(taken)
    assert set(taken) <= set(fields(kind))
    for name in taken:
        if name == "config":
            continue  # the web's config is a pasted config.json (the setting names files): its own test
        default = inspect_default(func, name)
        try:
            parse({"model": LLAMA, name: default}, kind)
        except SchemaError as exc:
            pytest.fail(f"{kind}: {name}={default!r}: {exc}")
    with pytest.raises(SchemaError) as exc:
        parse({"model": LLAMA, "no_such_keyword": 1}, kind)
    listed = str(exc.value).split("the fields are: ")[1].split(", ")
    assert set(taken) <= set(listed)


def inspect_default(func, name):
    import inspect

    value = inspect.signature(func).parameters[name].default
    return getattr(value, "value", value)


def test_plan_takes_top_and_the_search_switches(client):
    """The reported body: top=3 with engine any; /v1/plan answers what plan_memory(..., top=3) does."""
    body = {"mode": "serve", "engine": "any", "top": 3, "gpus_available": "4xL4", "max_model_len": 8192,
            "allow_optimizer_change": False, "allow_batch_reshape": False}
    r = client.post("/v1/plan", json={"model": LLAMA, **body})
    assert r.status_code == 200, r.text
    assert r.json() == memest.plan_memory(LLAMA, **body).to_dict()
    r = client.post("/v1/plan", json={"model": LLAMA, "top": "3"})
    assert r.status_code == 422 and "'top' is '3'; it must be an integer" in r.json()["error"]
