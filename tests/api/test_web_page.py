"""The page at ``/`` driven in headless Chromium against the real stack: it asks, the answer streams
in with its sources, a source opens its passage; refusals (401, 429, 503) are said plainly."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys as Key
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from broker import apikeys
from broker.keys import Keys
from broker.settings import Settings
from tests.helpers import Api, api_without_redis

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="needs Debian's chromium and chromium-driver (deploy/install.sh installs them)",
    ),
]


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = CHROMIUM or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1200"):
        options.add_argument(arg)
    # The driver is Debian's: selenium must not look for one elsewhere.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER or ""), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(browser: WebDriver, seconds: float = 30) -> WebDriverWait:
    return WebDriverWait(browser, seconds)


def _message(browser: WebDriver) -> str:
    _wait(browser).until(ec.visibility_of_element_located((By.ID, "message")))
    return browser.find_element(By.ID, "message").text


def _ask(browser: WebDriver, question: str) -> None:
    box = browser.find_element(By.ID, "question")
    box.clear()
    box.send_keys(question)
    browser.find_element(By.ID, "submit").click()


def test_page_streams_an_answer_with_its_sources(
    api: Api, workers, test_index: str, browser: WebDriver, tmp_path: Path
) -> None:
    page = httpx.get(api.base + "/", timeout=10)
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(api.base + "/static/nothing.js", timeout=10).status_code == 404

    browser.get(api.base + "/")
    _wait(browser).until(lambda b: Select(b.find_element(By.ID, "index")).options)
    assert (
        Select(browser.find_element(By.ID, "index")).first_selected_option.get_attribute("value")
        == test_index
    )
    _ask(browser, "What is the house speciality of Café Lumière on Harbour Street?")

    answer = browser.find_element(By.ID, "answer")
    _wait(browser, 180).until(lambda b: answer.get_attribute("data-state") in ("done", "error"))
    assert answer.get_attribute("data-state") == "done", _message(browser)
    assert answer.text.strip()
    sources = browser.find_elements(By.CSS_SELECTOR, "#sources .source")
    assert sources and "Café Lumière" in sources[0].text
    assert "total" in browser.find_element(By.ID, "timings").text

    sources[0].click()
    passage = browser.find_element(By.ID, "passage-text")
    _wait(browser).until(lambda b: passage.is_displayed())
    assert "cardamom" in passage.text
    browser.save_screenshot(str(tmp_path / "page.png"))
    assert (tmp_path / "page.png").stat().st_size > 0


def test_page_says_why_a_request_was_refused(
    auth_apis: list[Api], settings: Settings, browser: WebDriver, tmp_path: Path, test_index: str
) -> None:
    base = auth_apis[0].base
    browser.get(base + "/")
    assert "Enter an API key" in _message(browser)  # no key yet: what to do, not a refusal
    browser.find_element(By.ID, "key").send_keys("rl_not-a-key", Key.TAB)  # fires its change
    _wait(browser).until(lambda b: "API key was refused" in b.find_element(By.ID, "message").text)
    browser.find_element(By.ID, "key").clear()

    # A key with one request in its bucket: the index list spends it, the question gets 429.
    key, _ = apikeys.create(
        redis.Redis.from_url(settings.redis.redis_url),
        Keys(settings.redis.key_prefix),
        "page",
        rate=0.01,
        burst=1,
    )
    browser.find_element(By.ID, "key").send_keys(key, Key.TAB)
    _wait(browser).until(lambda b: Select(b.find_element(By.ID, "index")).options)
    assert browser.execute_script("return localStorage.getItem('ragline.apiKey')") == key
    _ask(browser, "When does Café Lumière open?")
    _wait(browser).until(lambda b: "Too many requests" in b.find_element(By.ID, "message").text)
    assert "Try again in" in _message(browser)

    # An API whose Redis is gone: 503, with when to come back.
    with api_without_redis(settings, tmp_path / "api.log") as orphan:
        browser.get(orphan.base + "/")  # another origin: the key is entered again
        browser.find_element(By.ID, "key").send_keys(key)
        _ask(browser, "When does Café Lumière open?")
        _wait(browser).until(lambda b: "cannot answer now" in b.find_element(By.ID, "message").text)
        assert "Try again in 1 s" in _message(browser)
