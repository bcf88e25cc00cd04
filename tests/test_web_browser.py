"""The page in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by
Selenium against ``memest serve`` on a free port of 127.0.0.1, started here and stopped after. It opens the
page, picks a model, moves a slider and checks that the verdict and the bar chart follow; the screenshots
are saved under the test's tmp_path."""

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
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


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
    # 512 x 1 GiB of KV, far beyond 22.49 GiB
    slider = browser.find_element(By.ID, "batch_size")
    slider.send_keys(Keys.END)
    wait.until(lambda d: d.find_element(By.ID, "batch_size-out").text == "512")
    wait.until(lambda d: d.find_element(By.ID, "verdict").text != first)
    verdict = browser.find_element(By.ID, "verdict").text
    assert verdict.startswith("Does not fit on 1 × L4"), verdict
    wait.until(lambda d: _bar_widths(d) != first_bars)
    assert "batch_size=512" in browser.current_url and "model=meta-llama%2FLlama-3.1-8B" in browser.current_url
    assert "--batch-size 512" in browser.find_element(By.ID, "command").get_attribute("value")
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


def test_a_bad_value_shows_the_one_line_error(server, browser):
    wait = WebDriverWait(browser, 20)
    browser.get(server + "/?model=no-such/model-xyz")
    wait.until(lambda d: d.find_element(By.ID, "error").is_displayed())
    assert "unknown model 'no-such/model-xyz'" in browser.find_element(By.ID, "error").text
