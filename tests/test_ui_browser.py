"""`llmplan ui` in a real browser: Debian's chromium and chromedriver, headless, driven by
Selenium. The page loads, a changed field redraws the figures, and what it shows is what
`llmplan estimate --json` prints for the same inputs; a bad value shows the CLI's error beside
its field. Skipped, saying why, where chromium, chromedriver, selenium or plotly is missing.

LLMPLAN_UPDATE_SCREENSHOTS=1 writes the docs' screenshot (docs/img/ui-estimate.png)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the ui extra (plotly) is not installed")
pytest.importorskip("selenium", reason="selenium is not installed (the dev extra has it)")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("chromium and chromedriver are not installed (apt-get install chromium "
                "chromium-driver)", allow_module_level=True)


@pytest.fixture(scope="module")
def url(ui_url):
    return ui_url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    downloads = tmp_path_factory.mktemp("downloads")
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    try:
        driver = webdriver.Chrome(options=opts, service=service)
    except Exception as err:  # a chromium that cannot start here (no shared memory, ...)
        pytest.skip(f"chromium did not start: {str(err).splitlines()[0]}")
    driver.set_page_load_timeout(60)
    driver.downloads = downloads
    yield driver
    driver.quit()


def cli_json(command: str) -> dict:
    argv = shlex.split(command)
    assert argv[0] == "llmplan"
    r = subprocess.run([sys.executable, "-m", "planner", *argv[1:]], capture_output=True,
                       text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin"},
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def runs(driver) -> int:
    return int(driver.find_element(By.TAG_NAME, "body").get_attribute("data-runs") or 0)


def wait_run(driver, before: int) -> None:
    WebDriverWait(driver, 120).until(lambda d: runs(d) > before)


def set_field(driver, view: str, name: str, value: str) -> None:
    """Type over a field's text as a user does (select all, type; WebDriver's clear() would
    send a change of its own); Tab leaves the field, which sends the change."""
    before = runs(driver)
    el = driver.find_element(By.CSS_SELECTOR, f"#form-{view} [name={name}]")
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(value, Keys.TAB)
    wait_run(driver, before)
    assert el.get_attribute("value") == value


def last(driver, view: str) -> tuple[dict, str]:
    return driver.execute_script(f"return [window.llmplan.last.{view}, "
                                 f"window.llmplan.commands.{view}]")


def no_script_errors(driver) -> None:
    """The page's console holds no error but the favicon it does not have."""
    errors = [e["message"] for e in driver.get_log("browser")
              if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]
              and "the server responded with a status of 400" not in e["message"]]
    assert errors == []


def shot(driver, name: str, tmp_path: Path) -> Path:
    out = ROOT / "docs" / "img" if os.environ.get("LLMPLAN_UPDATE_SCREENSHOTS") == "1" \
        else tmp_path
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    driver.save_screenshot(str(path))
    return path


def test_estimate_page_redraws_and_shows_the_cli_figures(browser, url, tmp_path):
    browser.get(url)
    wait_run(browser, 0)
    first, command = last(browser, "estimate")
    assert command == ("llmplan estimate --model llama-3.1-8b --gpu h100-sxm --engine vllm "
                       "--tp 1 --pp 1 --ep 1 --batch 1 --prompt-tokens 1024 "
                       "--output-tokens 256 --json")
    tpot_card = browser.find_element(By.CSS_SELECTOR, '.card[data-key="tpot_s"] .value')
    before_text = tpot_card.text

    set_field(browser, "estimate", "batch", "32")
    d, command = last(browser, "estimate")
    assert "--batch 32" in command
    assert d == cli_json(command)  # the page's figures are the CLI's
    assert d["batch"] == 32 and d["tpot_s"] != first["tpot_s"]
    tpot = browser.find_element(By.CSS_SELECTOR, '.card[data-key="tpot_s"] .value').text
    assert tpot != before_text
    assert float(tpot.split()[0].replace(",", "")) == pytest.approx(d["tpot_s"] * 1e3,
                                                                    rel=5e-3)
    band = browser.find_element(By.CSS_SELECTOR, '.card[data-key="tpot_s"] .band').text
    assert band.startswith("band ") and band != "no error band"
    # the roofline's points are the JSON's operators (FLOP/byte, FLOP/s)
    decode = browser.execute_script(
        "return document.getElementById('chart-roofline').data[0]")
    ops = [o for o in d["operators"]["decode"] if o["flops"] > 0]
    assert decode["x"] == pytest.approx([o["intensity_flops_per_byte"] for o in ops])
    assert decode["y"] == pytest.approx([o["flops"] / o["time_s"] for o in ops])
    memory = browser.execute_script("return document.getElementById('chart-memory').data")
    assert memory[1]["name"] == "KV cache"
    assert memory[1]["x"][0] == pytest.approx(d["kv_cache_bytes"] / 2**30)
    kv = browser.find_element(By.ID, "kv-estimate").text
    assert f"{d['kv_concurrency']['max_concurrency_paged']:,}" in kv

    before = runs(browser)
    Select(browser.find_element(By.CSS_SELECTOR, "#form-estimate [name=weights]")
           ).select_by_value("fp8")
    wait_run(browser, before)
    d, command = last(browser, "estimate")
    assert "--weights fp8" in command and d["weights"] == "fp8"
    assert d == cli_json(command)
    no_script_errors(browser)
    png = shot(browser, "ui-estimate.png", tmp_path)
    assert png.stat().st_size > 10_000


def test_a_bad_value_shows_the_cli_error_beside_its_field(browser, url):
    browser.get(url)
    wait_run(browser, 0)
    set_field(browser, "estimate", "batch", "-4")
    err = browser.find_element(By.CSS_SELECTOR, '#form-estimate .err[data-for="batch"]')
    assert err.text == "llmplan: error: --batch: must be positive, got -4"
    field = browser.find_element(By.CSS_SELECTOR, "#form-estimate [name=batch]")
    assert "bad" in field.get_attribute("class")
    set_field(browser, "estimate", "batch", "nan")
    assert err.text.startswith("llmplan estimate: error: --batch: ")
    set_field(browser, "estimate", "batch", "8")  # the server kept serving
    assert err.text == ""
    assert last(browser, "estimate")[0]["batch"] == 8


def test_the_plan_view_ranks_what_plan_ranks(browser, url, tmp_path):
    browser.get(url)
    wait_run(browser, 0)
    browser.find_element(By.CSS_SELECTOR, '#tabs button[data-view="plan"]').click()
    for name, value in (("rps", "6"), ("tp", "1"), ("pp", "1"), ("weights", "bf16,fp8"),
                        ("kv_cache", "16"), ("sim_requests", "40")):
        el = browser.find_element(By.CSS_SELECTOR, f"#form-plan [name={name}]")
        el.clear()
        el.send_keys(value)
    Select(browser.find_element(By.CSS_SELECTOR, "#form-plan [name=disaggregated]")
           ).select_by_value("off")
    before = runs(browser)
    browser.find_element(By.CSS_SELECTOR, "#form-plan button[type=submit]").click()
    wait_run(browser, before)
    rows, command = last(browser, "plan")
    assert command.startswith("llmplan plan --model llama-3.1-8b --gpu h100-sxm ")
    expected = cli_json(command)
    assert rows == expected
    table = browser.find_elements(By.CSS_SELECTOR, "#table-plan tr")[1:]
    shown = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")][:5] for tr in table]
    assert shown == [[str(r["rank"]), r["gpu"], f"TP{r['tp']}", r["weights"], r["kv_cache"]]
                     for r in expected]
    assert "price set hyperscaler-on-demand" in browser.find_element(By.ID, "summary-plan").text
    front = browser.execute_script("return document.getElementById('chart-pareto').data[1]")
    assert front["x"] and all(x in [r["latency_s"] for r in expected] for x in front["x"])
    no_script_errors(browser)
    shot(browser, "ui-plan.png", tmp_path)


def test_the_simulate_view_draws_one_point_per_rate(browser, url, tmp_path):
    browser.get(url)
    wait_run(browser, 0)
    browser.find_element(By.CSS_SELECTOR, '#tabs button[data-view="simulate"]').click()
    for name, value in (("request_rate", "1,4,16"), ("num_requests", "120")):
        el = browser.find_element(By.CSS_SELECTOR, f"#form-simulate [name={name}]")
        el.clear()
        el.send_keys(value)
    before = runs(browser)
    browser.find_element(By.CSS_SELECTOR, "#form-simulate button[type=submit]").click()
    wait_run(browser, before)
    page, command = last(browser, "simulate")
    assert command.startswith("for rate in 1 4 16; do llmplan simulate --model llama-3.1-8b ")
    assert [d["request_rate"] for d in page] == [1.0, 4.0, 16.0]
    curve = browser.execute_script("return document.getElementById('chart-curve').data[0]")
    assert curve["x"] == pytest.approx([d["output_throughput"] for d in page])
    assert curve["y"] == pytest.approx([d["median_e2el_ms"] for d in page])
    rows = browser.find_elements(By.CSS_SELECTOR, "#table-simulate tr")[1:]
    assert [tr.find_elements(By.TAG_NAME, "td")[0].text for tr in rows] == ["1", "4", "16"]
    # "copy as CLI command" selects the command; "download JSON" saves the objects drawn
    browser.find_element(By.CSS_SELECTOR, 'button.copy[data-view="simulate"]').click()
    assert browser.execute_script("return window.getSelection().toString()") == command
    browser.find_element(By.CSS_SELECTOR, 'button.download[data-view="simulate"]').click()
    saved = browser.downloads / "llmplan-simulate.json"
    WebDriverWait(browser, 30).until(lambda d: saved.is_file() and saved.stat().st_size > 0)
    assert json.loads(saved.read_text()) == page
    no_script_errors(browser)
    shot(browser, "ui-simulate.png", tmp_path)


def test_an_uploaded_config_json_is_estimated_and_a_bad_one_refused(browser, url, tmp_path):
    browser.get(url)
    wait_run(browser, 0)
    good = tmp_path / "config.json"
    good.write_text((ROOT / "tests" / "fixtures" / "hf" / "llama-3.1-8b.json").read_text())
    upload = browser.find_element(By.CSS_SELECTOR, "#form-estimate [name=model_file]")
    before = runs(browser)
    upload.send_keys(str(good))
    wait_run(browser, before)
    d, command = last(browser, "estimate")
    assert "--model config.json" in command and d["params"] > 8e9
    err = browser.find_element(By.CSS_SELECTOR, '#form-estimate .err[data-for="model"]')
    assert err.text == ""

    bad = tmp_path / "bad" / "config.json"
    bad.parent.mkdir()
    bad.write_text('{"hidden_size": 4096,')
    before = runs(browser)
    upload.send_keys(str(bad))
    wait_run(browser, before)
    assert err.text == "llmplan: error: config.json: line 1: malformed JSON: Expecting " \
        "property name enclosed in double quotes"

    big = tmp_path / "big" / "config.json"  # refused in the browser, before it is sent
    big.parent.mkdir()
    big.write_bytes(b" " * (50 * 2**20))
    upload.send_keys(str(big))
    WebDriverWait(browser, 30).until(lambda d: "50.0 MiB" in err.text)
    assert err.text == ("llmplan: error: config.json: 50.0 MiB, larger than the 4 MiB a file "
                        "may be")
