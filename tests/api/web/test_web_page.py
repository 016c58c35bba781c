"""The page at ``/`` driven in headless Chromium against the real stack: it asks, the answer streams
in with its sources, a source opens its passage; refusals (401, 429, 503) are said plainly; an
answer's Markdown is rendered (a code block) with HTML shown as text, a cached answer is badged;
a stream dropped mid-answer is resumed after its last event, with no gap and no repeat."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from ragline.broker.config.settings import Settings
from ragline.broker.redis.keys import Keys
from ragline.broker.state import apikeys, indexes
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys as Key
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.helpers import Api, api_without_redis, result_cache_key

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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP refusals are logged there
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


def _policy_refusals(browser: WebDriver) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]


def test_the_docs_pages_run_on_their_own_scripts_and_no_page_can_be_framed(
    api: Api, browser: WebDriver, tmp_path: Path
) -> None:
    browser.get(api.base + "/docs")
    title = (By.CSS_SELECTOR, ".swagger-ui .info .title")
    _wait(browser).until(lambda b: "ragline" in b.find_element(*title).text)
    assert browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path[data-path='/v1/query']")
    assert _policy_refusals(browser) == []  # Swagger UI needs nothing the policy refuses
    browser.get(api.base + "/redoc")
    _wait(browser).until(lambda b: "ragline" in b.find_element(By.CSS_SELECTOR, ".api-info h1").text)
    assert browser.find_elements(By.XPATH, "//h2[contains(., 'Upload Documents')]")
    # Redoc's footer asks for its maker's logo from elsewhere: the one thing the policy refuses.
    refused = _policy_refusals(browser)
    assert all("Loading the image 'https://cdn.redoc.ly/" in m for m in refused), refused
    browser.save_screenshot(str(tmp_path / "redoc.png"))

    # A page elsewhere that lays the page (or the docs) in a frame gets nothing of it.
    for path in ("/", "/docs"):
        framing = tmp_path / "framing.html"
        framing.write_text(f'<iframe id="framed" src="{api.base}{path}"></iframe>')
        browser.get(framing.as_uri())
        _wait(browser).until(lambda b: any("frame-ancestors" in m for m in _policy_refusals(b)))
        browser.switch_to.frame(browser.find_element(By.ID, "framed"))
        assert browser.find_elements(By.ID, "question") == []
        assert browser.find_elements(By.ID, "swagger-ui") == []
        browser.switch_to.default_content()


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


# -- Markdown, safely ---------------------------------------------------------------------------

CODE = 'def opening_hours():\n    return "7:15" if open else "<closed>"'
MARKDOWN_ANSWER = f"""Café Lumière opens at **7:15** [1].

```python
{CODE}
```

- Hours: `7:15`–`16:30`
- <img src=x onerror="window.pwned = 1">Dogs welcome <script>window.pwned = 2</script>
"""


def _plant_answer(settings: Settings, index: str, question: str, answer: str) -> None:
    """A cached answer for ``question`` as the page asks it: the page replays it (no worker)."""
    client = redis.Redis.from_url(settings.redis.redis_url)
    info = indexes.lookup(client, Keys(settings.redis.key_prefix), index)
    assert info is not None
    body = {"query": question, "index": index, "abort_on_disconnect": False}
    cached = {
        "answer": answer,
        "usage": {"prompt_tokens": 12, "completion_tokens": 40},
        "timings": {"queue_ms": 1.0, "retrieval_ms": 2.0, "generation_ms": 30.0, "total_ms": 40.0},
        "sources": [
            {
                "chunk_id": "c1",
                "source": "cafe.md",
                "title": "Café Lumière",
                "text": "Opens at 7:15.",
                "score": 0.9,
            }
        ],
        "cached": True,
    }
    client.set(result_cache_key(settings, body, version=info.version), json.dumps(cached), ex=300)


def test_page_renders_an_answers_markdown_with_html_as_text_and_badges_a_cached_answer(
    api: Api, settings: Settings, test_index: str, browser: WebDriver
) -> None:
    question = "How would I write Café Lumière's opening hours in Python?"
    _plant_answer(settings, test_index, question, MARKDOWN_ANSWER)
    browser.get(api.base + "/")
    _wait(browser).until(lambda b: Select(b.find_element(By.ID, "index")).options)
    _ask(browser, question)
    answer = browser.find_element(By.ID, "answer")
    _wait(browser).until(lambda b: answer.get_attribute("data-state") in ("done", "error"))
    assert answer.get_attribute("data-state") == "done", _message(browser)

    code = answer.find_element(By.CSS_SELECTOR, "pre > code.language-python")
    assert code.get_attribute("textContent") == CODE
    assert answer.find_element(By.TAG_NAME, "strong").text == "7:15"
    items = answer.find_elements(By.CSS_SELECTOR, "ul > li")
    assert [i.find_element(By.TAG_NAME, "code").text for i in items[:1]] == ["7:15"]
    # The markup in the answer is its text: no element made of it, nothing run.
    assert '<img src=x onerror="window.pwned = 1">' in items[1].text and "<script>" in items[1].text
    assert answer.find_elements(By.CSS_SELECTOR, "img, script") == []
    assert browser.execute_script("return window.pwned") is None

    answer.find_element(By.CSS_SELECTOR, "button.cite").click()  # [1] opens its source
    _wait(browser).until(lambda b: b.find_element(By.ID, "passage-text").is_displayed())
    badge = browser.find_element(By.ID, "badge")
    assert badge.is_displayed() and badge.text == "cached"


# Each renderer case: Markdown in, the HTML it becomes (an element tree, never HTML parsed).
RENDERED = [
    ("# Title\n\ntwo\nlines", "<h1>Title</h1><p>two<br>lines</p>"),
    ("*em* **strong** `a<b`", "<p><em>em</em> <strong>strong</strong> <code>a&lt;b</code></p>"),
    ("snake_case_name \\*not em\\*", "<p>snake_case_name *not em*</p>"),
    ("- a\n  - b\n- c", "<ul><li>a<ul><li>b</li></ul></li><li>c</li></ul>"),
    ("3. three\n4. four", '<ol start="3"><li>three</li><li>four</li></ol>'),
    ("```\nopen fence, still streaming", "<pre><code>open fence, still streaming</code></pre>"),
    ("> quoted\n\n---", "<blockquote><p>quoted</p></blockquote><hr>"),
    (
        "[docs](https://docs.python.org/3/) [bad](javascript:void0)",
        '<p><a href="https://docs.python.org/3/" rel="noopener noreferrer nofollow" target="_blank">docs</a>'
        " <span>bad</span></p>",
    ),
    ("![tracker](https://example.com/t.png)", "<p>tracker</p>"),
    ("<b onclick=x>bold?</b>", "<p>&lt;b onclick=x&gt;bold?&lt;/b&gt;</p>"),
    ("cites [1] and [9]", '<p>cites <button class="cite">[1]</button> and [9]</p>'),
]


def test_the_markdown_renderer_builds_elements_and_never_parses_html(api: Api, browser: WebDriver) -> None:
    browser.get(api.base + "/")
    for markdown, html in RENDERED:
        rendered = browser.execute_script(
            """const cite = (n) => n === 1 ? Object.assign(document.createElement("button"),
                   {className: "cite", textContent: `[${n}]`}) : null;
               const box = document.createElement("div");
               box.append(RaglineMarkdown.render(arguments[0], {cite}));
               return box.innerHTML;""",
            markdown,
        )
        assert rendered == html, markdown
    # A semantic cache hit says so, with the question it matched.
    browser.execute_script(
        "renderBadge({cached: 'semantic',"
        " semantic_match: {question: 'How do I open the café?', similarity: 0.997}})"
    )
    badge = browser.find_element(By.ID, "badge")
    assert badge.get_attribute("textContent") == "semantic cache"
    assert "How do I open the café?" in badge.get_attribute("title")


# -- a dropped stream, resumed ------------------------------------------------------------------


@dataclass
class Relay:
    """A TCP relay between the browser and the API that cuts the first connection to carry a
    ``token`` event right after forwarding it (a dropped connection mid-answer), and keeps what
    went each way on every connection."""

    upstream: tuple[str, int]
    cut_on: bytes = b"event: token"
    requests: list[bytearray] = field(default_factory=list)
    responses: list[bytearray] = field(default_factory=list)
    cut: int | None = None  # the index of the connection it cut

    def __post_init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._server.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            with self._lock:
                n = len(self.requests)
                self.requests.append(bytearray())
                self.responses.append(bytearray())
            threading.Thread(target=self._pump, args=(down, up, self.requests[n], None), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, self.responses[n], n), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, seen: bytearray, n: int | None) -> None:
        try:
            while data := src.recv(65536):
                seen += data
                dst.sendall(data)
                with self._lock:
                    cutting = n is not None and self.cut is None and self.cut_on in seen
                    if cutting:
                        self.cut = n
                if cutting:
                    break
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._server.close()


FRAME = re.compile(rb"id: (\S+)\nevent: (\w+)\ndata: (.*)\n\n")


def _frames(raw: bytes) -> list[tuple[str, str, dict]]:
    return [(i.decode(), e.decode(), json.loads(d)) for i, e, d in FRAME.findall(raw)]


def test_page_resumes_a_dropped_stream_after_its_last_event(
    api: Api, workers, test_index: str, browser: WebDriver
) -> None:
    host, port = api.base.removeprefix("http://").split(":")
    relay = Relay((host, int(port)))
    try:
        browser.get(relay.base + "/")
        _wait(browser).until(lambda b: Select(b.find_element(By.ID, "index")).options)
        _ask(browser, "Where is Café Lumière, and what is its house speciality? Answer in detail.")
        answer = browser.find_element(By.ID, "answer")
        _wait(browser, 180).until(lambda b: answer.get_attribute("data-state") in ("done", "error"))
        assert answer.get_attribute("data-state") == "done", _message(browser)
        assert relay.cut is not None, "the relay never saw a token to cut after"
        assert answer.get_attribute("data-resumes") == "1"
    finally:
        relay.close()

    before = _frames(relay.responses[relay.cut])
    # The browser keeps connections alive: the resume may follow other requests on its connection.
    resume = b"GET /v1/query/stream/"
    resumes = [n for n, r in enumerate(relay.requests) for _ in range(r.count(resume))]
    assert len(resumes) == 1, [bytes(r[:60]) for r in relay.requests]
    sent = relay.requests[resumes[0]]
    head = sent[sent.index(resume) :].decode().lower()
    assert f"last-event-id: {before[-1][0]}\r\n" in head, (head, before[-1])
    after = _frames(relay.responses[resumes[0]])
    ids = [i for i, _, _ in before + after]
    assert len(ids) == len(set(ids)), "an event came twice"
    assert after[-1][1] == "done"
    tokens = "".join(d["text"] for _, e, d in before + after if e == "token")
    assert tokens == after[-1][2]["answer"], "the tokens before and after the drop are not the answer"
    assert answer.text.strip()
