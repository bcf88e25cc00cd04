"""The page in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by
Selenium against ``memest serve`` on a free port of 127.0.0.1, started here and stopped after. It opens the
page, picks a model, moves a slider and checks that the verdict and the bar chart follow, sweeps a slider's
range into the chart and moves the slider from it, picks a training stack; every test reads the browser's
console, which must hold no error. The screenshots are saved under the test's tmp_path."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

pytestmark = pytest.mark.slow

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip("needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver): "
                f"{CHROMIUM} or {CHROMEDRIVER} is absent", allow_module_level=True)
pytest.importorskip("selenium", reason="needs selenium (pip install selenium)")
pytest.importorskip("uvicorn", reason="the web extra is not installed: pip install 'memest[web]'")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "memest", "serve", "--port", str(port)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                with urllib.request.urlopen(url + "/v1/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"memest serve exited: {proc.stderr.read().decode()}")
                time.sleep(0.1)
        else:
            pytest.fail("memest serve did not answer /v1/health within 20 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, read by _console_errors
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _console_errors(driver, allowed: tuple[str, ...] = ()) -> list[str]:
    """The console's errors since the last call (a script error, a failed load), less those naming ``allowed``."""
    return [e["message"] for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]


def _bar_widths(driver) -> list[float]:
    return [float(r.get_attribute("width")) for r in driver.find_elements(By.CSS_SELECTOR, "#bar rect")]


def test_pick_a_model_move_a_slider(server, browser, tmp_path):
    wait = WebDriverWait(browser, 20)
    browser.get(server + "/?gpu=L4")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#models option")) > 10)  # the catalog arrived
    model = browser.find_element(By.ID, "model")
    model.send_keys("meta-llama/Llama-3.1-8B", Keys.TAB)
    wait.until(lambda d: d.find_element(By.ID, "verdict").text.startswith(("Fits", "Does not fit")))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#bar rect"))
    # serving Llama-3.1-8B on one L4 (22.49 GiB): bf16 weights alone are 8.03e9 x 2 B = 14.96 GiB, and the
    # context starts at 2^13 = 8192 tokens: 8192 x 128 KiB of KV (2 x 32 layers x 8 kv heads x 128 x 2 B) = 1 GiB
    assert browser.find_element(By.ID, "max_model_len-out").text == "8k"
    first = browser.find_element(By.ID, "verdict").text
    first_bars = _bar_widths(browser)
    assert first.startswith("Fits on 1 × L4"), first
    browser.save_screenshot(str(tmp_path / "fits.png"))
    # move the concurrency slider to its end with the keyboard: 2^9 = 512 sequences of 8k tokens need
    # 512 x 1 GiB of KV, far beyond 22.49 GiB; vLLM still starts (its pool holds one 8k sequence: 1 GiB
    # < 22.49 - 14.96 GiB) and the rest wait
    slider = browser.find_element(By.ID, "batch_size")
    slider.send_keys(Keys.END)
    wait.until(lambda d: d.find_element(By.ID, "batch_size-out").text == "512")
    wait.until(lambda d: d.find_element(By.ID, "verdict").text != first)
    queued = browser.find_element(By.ID, "verdict").text
    assert queued.startswith("Starts on 1 × L4: holds "), queued
    assert queued.endswith(" of 512 concurrent sequences at 8,192 tokens (the rest wait)"), queued
    assert "queues" in browser.find_element(By.ID, "verdict").get_attribute("class")
    wait.until(lambda d: _bar_widths(d) != first_bars)
    assert "batch_size=512" in browser.current_url and "model=meta-llama%2FLlama-3.1-8B" in browser.current_url
    assert "--batch-size 512" in browser.find_element(By.ID, "command").get_attribute("value")
    browser.save_screenshot(str(tmp_path / "queues.png"))
    # the context slider to its end, 2^17 = 131,072 tokens: one sequence's KV is 131,072 x 128 KiB = 16 GiB,
    # and 14.96 + 16 GiB > 22.49 GiB: vLLM refuses to start
    browser.find_element(By.ID, "max_model_len").send_keys(Keys.END)
    wait.until(lambda d: d.find_element(By.ID, "verdict").text.startswith("Does not fit"))
    verdict = browser.find_element(By.ID, "verdict").text
    assert verdict.startswith("Does not fit on 1 × L4"), verdict
    browser.save_screenshot(str(tmp_path / "does-not-fit.png"))
    # the address reproduces the view
    browser.get(browser.current_url)
    wait.until(lambda d: d.find_element(By.ID, "verdict").text == verdict)
    # readable on a phone: nothing wider than the window at 390 px
    browser.set_window_size(390, 844)
    width = browser.execute_script("return document.documentElement.scrollWidth")
    inner = browser.execute_script("return window.innerWidth")
    assert width <= inner, (width, inner)
    browser.save_screenshot(str(tmp_path / "phone.png"))
    print(f"screenshots in {tmp_path}")
    assert _console_errors(browser) == []


def test_training_mode_shows_the_training_sliders(server, browser):
    """Mode chosen with the keyboard: the micro-batch and sequence-length sliders replace the serving ones,
    and the estimate is a training one (Llama-3.1-8B full training on one L4 cannot fit: 16 B/param of
    mixed-precision model states alone are 8.03e9 x 16 B = 119.7 GiB against 22.49 GiB)."""
    from selenium.webdriver.support.ui import Select

    wait = WebDriverWait(browser, 20)
    browser.get(server + "/?model=meta-llama%2FLlama-3.1-8B&gpu=L4")
    wait.until(lambda d: d.find_element(By.ID, "verdict").text.startswith("Fits"))
    Select(browser.find_element(By.ID, "mode")).select_by_value("train")
    wait.until(lambda d: d.find_element(By.ID, "verdict").text.startswith("Does not fit on 1 × L4"))
    assert browser.find_element(By.ID, "micro_batch_size").is_displayed()
    assert not browser.find_element(By.ID, "batch_size").is_displayed()
    assert "--train" in browser.find_element(By.ID, "command").get_attribute("value")
    assert "mode=train" in browser.current_url
    assert _console_errors(browser) == []


def test_a_bad_value_shows_the_one_line_error(server, browser):
    wait = WebDriverWait(browser, 20)
    browser.get(server + "/?model=no-such/model-xyz")
    wait.until(lambda d: d.find_element(By.ID, "error").is_displayed())
    assert "unknown model 'no-such/model-xyz'" in browser.find_element(By.ID, "error").text
    # the 400 answers are logged as failed loads; nothing else may be
    assert _console_errors(browser, allowed=("status of 400",)) == []


def _points(driver) -> dict[int, str]:
    """The sweep chart's points: value -> fill (green fits, red does not; white: drawn on the top edge)."""
    pairs = driver.execute_script("return [...document.querySelectorAll('#sweep-chart circle.point')]"
                                  ".map((c) => [c.getAttribute('data-value'), c.getAttribute('fill')])")
    return {int(value): fill for value, fill in pairs}


def _sweeps_requested(driver) -> int:
    return driver.execute_script("return performance.getEntriesByType('resource')"
                                 ".filter((e) => e.name.endsWith('/v1/sweep')).length")


GREEN, RED = "#1a7f37", "#b3261e"


def test_sweep_chart(server, browser, tmp_path):
    """Serving Llama-3.1-8B on one L4 (22.49 GiB): the chart sweeps the context slider's range, 2^9..2^17
    (the model's 131,072 tokens), at concurrency 1. 8k fits: bf16 weights 8.03e9 x 2 B = 14.96 GiB + 8192 x
    128 KiB of KV (2 x 32 layers x 8 kv heads x 128 x 2 B) = 1 GiB; 128k does not: 16 GiB of KV on top of the
    weights is 31 GiB. Swept over concurrency at 8k: 512 sequences need 512 GiB of KV, past 3 x 22.49 GiB, so
    that point sits hollow on the top edge. A point clicked or reached with Tab and Enter moves the slider."""
    wait = WebDriverWait(browser, 20)
    browser.get(server + "/?model=meta-llama%2FLlama-3.1-8B&gpu=L4")
    wait.until(lambda d: len(_points(d)) == 9)
    points = _points(browser)
    assert sorted(points) == [2**k for k in range(9, 18)]
    assert points[8192] == GREEN and points[131072] == RED
    summary = browser.find_element(By.ID, "sweep-summary").text
    assert summary.startswith("Largest Context (max_model_len) that fits on 1 × L4: "), summary
    assert browser.find_elements(By.CSS_SELECTOR, "#sweep-chart [data-line=largest]")
    assert browser.find_elements(By.CSS_SELECTOR, "#sweep-chart [data-line=capacity]")
    assert browser.find_elements(By.CSS_SELECTOR, "#sweep-chart polygon[data-kind=kv_cache]")
    browser.save_screenshot(str(tmp_path / "sweep-context.png"))
    # the sweep as a table: a row per point under a header row
    browser.find_element(By.CSS_SELECTOR, "#sweep-details summary").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#sweep-table tr")) == 1 + 9
    # sweep concurrency instead (1..512, ten points); the choice goes in the address
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(By.ID, "sweep")).select_by_value("batch_size")
    wait.until(lambda d: len(_points(d)) == 10)
    assert "sweep=batch_size" in browser.current_url
    points = _points(browser)
    assert points[1] == GREEN and points[512] == "#fff"
    # click a point: the concurrency slider moves there, the estimate follows; the sweep is not asked again
    # (only the swept slider moved)
    asked = _sweeps_requested(browser)
    browser.find_element(By.CSS_SELECTOR, "#sweep-chart circle[data-value='256']").click()
    wait.until(lambda d: d.find_element(By.ID, "batch_size-out").text == "256")
    # 256 sequences of 8k need 256 GiB of KV: vLLM starts (one 8k sequence's 1 GiB fits beside the 14.96 GiB of
    # weights) and the rest wait
    wait.until(lambda d: d.find_element(By.ID, "verdict").text.startswith("Starts on 1 × L4: holds "))
    assert browser.find_element(By.ID, "verdict").text.endswith(" of 256 concurrent sequences at 8,192 tokens (the rest wait)")
    assert "batch_size=256" in browser.current_url
    # with the keyboard: Tab from the sweep picker reaches the points, Enter on the first picks concurrency 1
    browser.find_element(By.ID, "sweep").send_keys(Keys.TAB)
    wait.until(lambda d: d.switch_to.active_element.get_attribute("data-value") == "1")
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait.until(lambda d: d.find_element(By.ID, "batch_size-out").text == "1")
    # the redraw keeps the focus on that point
    wait.until(lambda d: d.switch_to.active_element.get_attribute("data-value") == "1")
    wait.until(lambda d: d.find_element(By.ID, "verdict").text.startswith("Fits on 1 × L4"))
    assert _sweeps_requested(browser) == asked
    # the address reproduces the sweep picked
    browser.get(browser.current_url)
    wait.until(lambda d: len(_points(d)) == 10)
    assert browser.find_element(By.ID, "sweep").get_attribute("value") == "batch_size"
    # at 1,920 px the chart spreads and nothing is wider than the window
    browser.set_window_size(1920, 1080)
    wait.until(lambda d: d.execute_script("return document.getElementById('sweep-chart').viewBox.baseVal.width") > 850)  # 772 px at 1,280
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    browser.save_screenshot(str(tmp_path / "sweep-1920.png"))
    assert _console_errors(browser) == []


def test_stack_picker(server, browser):
    """The picker lists GET /v1/stacks (the page names none itself) and shows in training modes only. With
    no stack, one device means HF Trainer (issue 13), whose bf16=True is fp32 params under autocast
    (precision amp); torchtune's bf16 is pure bf16. The command line names the stack picked."""
    from selenium.webdriver.support.ui import Select

    wait = WebDriverWait(browser, 20)
    browser.get(server + "/?model=meta-llama%2FLlama-3.1-8B&gpu=L4&mode=lora")
    wait.until(lambda d: d.find_element(By.ID, "job-line").text.startswith("Stack "))
    stack = Select(browser.find_element(By.ID, "stack"))
    names = [o.get_attribute("value") for o in stack.options]
    with urllib.request.urlopen(server + "/v1/stacks") as r:
        import json

        assert names == [""] + [s["name"] for s in json.load(r)]
    assert len(names) == 1 + 14  # auto and the fourteen stacks of issue 13
    line = browser.find_element(By.ID, "job-line").text
    assert "HF Trainer" in line and "assumed: no stack named" in line and "precision amp" in line, line
    stack.select_by_value("torchtune")
    wait.until(lambda d: "--stack torchtune" in d.find_element(By.ID, "command").get_attribute("value"))
    wait.until(lambda d: "torchtune" in d.find_element(By.ID, "job-line").text)
    line = browser.find_element(By.ID, "job-line").text
    assert "(picked)" in line and "precision bf16" in line, line
    assert "pure bf16" in browser.find_element(By.ID, "stack-hint").text
    assert "stack=torchtune" in browser.current_url
    browser.get(browser.current_url)  # the address reproduces the stack picked
    wait.until(lambda d: "(picked)" in d.find_element(By.ID, "job-line").text)
    assert browser.find_element(By.ID, "stack").get_attribute("value") == "torchtune"
    # the sweep follows the stack: it is asked for the torchtune job (seq_len is the training sweep's default)
    wait.until(lambda d: len(_points(d)) > 0)
    assert browser.find_element(By.ID, "sweep").get_attribute("value") == "seq_len"
    # serving reads no stack: the picker hides and the command drops it
    Select(browser.find_element(By.ID, "mode")).select_by_value("serve")
    wait.until(lambda d: "--serve" in d.find_element(By.ID, "command").get_attribute("value"))
    assert not browser.find_element(By.ID, "stack").is_displayed()
    assert "--stack" not in browser.find_element(By.ID, "command").get_attribute("value")
    assert "stack=" not in browser.current_url
    assert browser.find_element(By.ID, "job-line").text == ""
    assert _console_errors(browser) == []


def test_check_a_pasted_log(server, browser, tmp_path):
    """A real vLLM 0.19 start-up log pasted into the check panel (tests/data/logs/vllm019_llama31_8b_h100_16384.log,
    from llm-d-planner's accuracy results: the fixture of tests/test_check.py), checked with the keyboard: the
    table shows the log's figures beside memest's, a row for the KV pool ('Available KV cache memory: 58.11 GiB',
    'GPU KV cache size: 476,016 tokens'), and the gap line; a text that is no log shows the one-line error."""
    wait = WebDriverWait(browser, 20)
    browser.get(server + "/")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#check-gpu option")) > 10)
    log = (ROOT / "tests" / "data" / "logs" / "vllm019_llama31_8b_h100_16384.log").read_text()
    area = browser.find_element(By.ID, "check-log")
    browser.execute_script("arguments[0].value = arguments[1]", area, log)  # a paste, not 5 kB of key presses
    area.send_keys(Keys.TAB)  # to the model field, the device picker, then the button
    browser.switch_to.active_element.send_keys(Keys.TAB)
    browser.switch_to.active_element.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("id") == "check-run"
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#check-result tr[data-figure=kv_cache_memory]"))
    cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#check-result tr[data-figure=kv_cache_memory] th, "
                                                                     "#check-result tr[data-figure=kv_cache_memory] td")]
    assert cells[:3] == ["kv_cache_memory", "kv_cache", "58.11 GiB"], cells
    assert cells[4].endswith("%"), cells
    tokens = browser.find_element(By.CSS_SELECTOR, "#check-result tr[data-figure=kv_cache_tokens] td:nth-of-type(2)")
    assert tokens.text == "476,016 tokens"
    caption = browser.find_element(By.CSS_SELECTOR, "#check-result caption").text
    assert caption.startswith("vLLM V1 0.19.0 log · meta-llama/Llama-3.1-8B-Instruct"), caption
    assert browser.find_element(By.CSS_SELECTOR, "#check-result .check-gap").text.startswith("Largest gap: ")
    browser.execute_script("document.getElementById('check-run').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "check.png"))
    browser.set_window_size(390, 844)  # readable on a phone: nothing wider than the window
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    # and the table itself fits: its figure, logged, memest and error columns (the term column hides, as the CLI's
    # narrow table drops it)
    assert browser.execute_script("const w = document.querySelector('#check-result .table-wrap');"
                                  "return w.scrollWidth <= w.clientWidth")
    browser.execute_script("document.querySelector('#check-result caption').scrollIntoView()")
    browser.save_screenshot(str(tmp_path / "check-phone.png"))
    browser.set_window_size(1280, 900)
    browser.execute_script("arguments[0].value = 'hello\\nworld'", area)
    browser.find_element(By.ID, "check-run").click()
    wait.until(lambda d: d.find_element(By.ID, "check-error").is_displayed())
    assert "is not a start-up or training log memest reads" in browser.find_element(By.ID, "check-error").text
    assert not browser.find_elements(By.CSS_SELECTOR, "#check-result tr")
    assert _console_errors(browser, allowed=("status of 400",)) == []
