"""A bounded load test of ``memest serve``: CLIENTS concurrent clients each send REQUESTS requests (four
estimates and a log check, in turn: :data:`REQUESTS`) to 127.0.0.1, then it stops. Prints the errors (must be zero: an error is any answer but HTTP 200, or one
that differs from the same request's answer before the load), p50 / p99 latency, throughput, and the
server's resident memory (VmRSS) before, during and after the run.

Reproduce: ``.venv/bin/python benchmarks/web_load.py`` (needs ``pip install 'memest[web]'``);
``--clients 50 --requests 200`` are the defaults. Results: benchmarks/web_load.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

V1_LOG = ROOT / "tests" / "data" / "logs" / "vllm019_llama31_8b_h100_16384.log"
"""A real vLLM 0.19 start-up log (llm-d-planner's accuracy results; tests/data/logs/README.md), checked by /v1/check."""

REQUESTS = [(path, json.dumps(b).encode(), marker) for path, b, marker in (
    ("/v1/estimate", {"model": "meta-llama/Llama-3.1-8B", "mode": "serve", "gpu": "L4", "max_model_len": 8192,
                      "batch_size": 4}, b'"per_device"'),
    ("/v1/estimate", {"model": "meta-llama/Llama-3.1-8B", "mode": "serve", "gpu": "H100", "max_model_len": 32768,
                      "batch_size": 16}, b'"per_device"'),
    ("/v1/estimate", {"model": "Qwen/Qwen2.5-7B", "mode": "lora", "gpu": "A100-80GB", "seq_len": 4096,
                      "micro_batch_size": 2}, b'"per_device"'),
    ("/v1/estimate", {"model": "meta-llama/Llama-3.1-70B", "mode": "train", "gpu": "H100", "gpus": 64,
                      "zero_stage": 3, "seq_len": 8192}, b'"per_device"'),
    ("/v1/check", {"log": V1_LOG.read_text()}, b'"figures"'),
)]
"""The request mix, in turn: (path, body, text every good answer holds)."""


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def client(port: int, n: int, offset: int, latencies: list[float], errors: list[str],
           expected: dict[int, bytes] | None = None) -> None:
    """Send ``n`` requests on one keep-alive connection; with ``expected``, each answer must be the same
    bytes as the warm-up's answer to the same body (concurrency changes no figure), else it records them."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(n):
        which = (offset + i) % len(REQUESTS)
        path, body, marker = REQUESTS[which]
        start = time.perf_counter()
        try:
            conn.request("POST", path, body=body, headers={"content-type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            if r.status != 200 or marker not in data:
                errors.append(f"HTTP {r.status}: {data[:200]!r}")
            elif expected is not None and which in expected and data != expected[which]:
                errors.append(f"body {which}: an answer differs from the warm-up's")
            elif expected is not None:
                expected.setdefault(which, data)
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        latencies.append(time.perf_counter() - start)
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "memest", "serve", "--port", str(port)], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        warm: list[float] = []
        answers: dict[int, bytes] = {}
        client(port, 2 * len(REQUESTS), 0, warm, [], answers)  # first requests load the models: not measured
        rss_start = rss_kib(server.pid)
        samples = [rss_start]
        latencies: list[float] = []
        errors: list[str] = []
        threads = [threading.Thread(target=client, args=(port, args.requests, k, latencies, errors, answers))
                   for k in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(1)
            samples.append(rss_kib(server.pid))
        wall = time.perf_counter() - t0
        rss_end = rss_kib(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=10)
    q = statistics.quantiles(latencies, n=100)
    total = args.clients * args.requests
    print(f"requests: {len(latencies)} of {total} ({args.clients} clients x {args.requests}), errors: {len(errors)}")
    for e in errors[:5]:
        print("  ", e)
    print(f"latency p50 {q[49] * 1e3:.1f} ms, p99 {q[98] * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms")
    print(f"throughput {len(latencies) / wall:.0f} requests/s over {wall:.1f} s wall")
    quarters = [samples[min(len(samples) - 1, round(f * (len(samples) - 1)))] / 1024 for f in (0.25, 0.5, 0.75, 1)]
    print(f"server VmRSS: after warm-up {rss_start / 1024:.1f} MiB; at 25/50/75/100% of the run "
          f"{' / '.join(f'{q:.1f}' for q in quarters)} MiB; peak {max(samples) / 1024:.1f} MiB, end "
          f"{rss_end / 1024:.1f} MiB (sampled each second, {len(samples)} samples)")
    sys.exit(1 if errors or len(latencies) != total else 0)


if __name__ == "__main__":
    main()
