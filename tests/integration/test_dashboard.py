"""The dashboard at ``/ui`` in a real browser: Debian's ``chromium`` headless, driven by Selenium through
Debian's ``chromium-driver``, against two real daemons (127.0.0.41/.42, ``alpha`` and ``bravo``) whose
llama-server is the fake, and a third on its own with an API key.

Checked: the files come with ``Content-Security-Policy: default-src 'self'`` and without a key;
``/llmman/on/{node}/api/...`` passes only the dashboard's calls, to a node of the pool; the page loads with no
error in the browser's console and shows both nodes up and a model loaded on the peer; Load and Unload clicked
on the page change ``/api/ps``, on this node and on the peer, and Delete empties the peer's store of a model;
a request sent by the test appears in the page's log (served on the peer: ``pool=1``, also checked on the
JSON); a cold start on this node shows in the page's "In progress" table as its pull (from a proxy to the
peer's ``/v2/`` that holds the blob requests until the test lets them go) with its bar, then as "loading on
alpha" (the fake llama-server stays loading until a gate file exists), then leaves it; the keyed daemon
shows its login form, refuses a wrong key and shows the pool with the right one, which stays in
``sessionStorage`` and out of the URL.

With ``LLMMAN_DASHBOARD_SHOT=PATH`` set, the page is saved there as a PNG during the cold start, after more
requests for the charts (docs/dashboard.png is made so).
Skipped when ``chromium``/``chromedriver`` or ``selenium`` are missing, except under CI (``CI`` set),
where that fails: ``scripts/setup.sh --test`` installs them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.fake_llama_server import make_launcher as make_fake_binary
from tests.fakes.inprocess import make_store
from tests.integration.daemons import (
    HOP,
    Daemon,
    free_port,
    local_ps,
    local_tags,
    start_daemon,
    wait_until,
)
from tests.integration.holding_proxy import HoldingProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HOSTS = {"alpha": "127.0.0.41", "bravo": "127.0.0.42"}
KEY = "dashboard-secret-key"
TINY, SOLO, BONLY = "docker.io/ai/tiny:latest", "docker.io/ai/solo:latest", "docker.io/ai/bonly:latest"
COLD = "docker.io/ai/cold:latest"  # bravo's alone: alpha pulls it through the holding proxy
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def browser_available() -> None:
    """Skip (fail under CI) unless Debian's chromium, its driver and selenium are installed."""
    missing = [p for p in (CHROMIUM, DRIVER) if not shutil.which(p)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if missing:
        why = (f"{', '.join(missing)} missing: run scripts/setup.sh --test "
               "(apt-get install chromium chromium-driver)")
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the browser: {why}")
        pytest.skip(why)


@dataclass
class Pool:
    nodes: dict[str, Daemon]
    keyed: Daemon
    proxy: HoldingProxy  # to bravo's port: holds blob requests until released
    gate: Path  # alpha's fake child loading a model pulled through the proxy stays loading until it exists


def _fake_env(tmp: Path, name: str) -> dict[str, str]:
    (tmp / "bin").mkdir()
    return {"LLMMAN_LLAMA_SERVER": str(make_fake_binary(tmp / "bin")), "LLMMAN_MEMORY": "4GB",
            "LLMMAN_NODE_NAME": name, "LLMMAN_NUM_PARALLEL": "2", "FAKE_REPLY": "w0 w1 w2 w3"}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    browser_available()
    ports = {name: free_port(host) for name, host in HOSTS.items()}
    stores = {"alpha": ("tiny", "solo"), "bravo": ("tiny", "bonly", "cold")}
    proxy = HoldingProxy((HOSTS["bravo"], ports["bravo"]), hold_request=b"/blobs/")
    gate = tmp_path_factory.mktemp("gate") / "loaded"
    started: list[Daemon] = []
    try:
        nodes = {}
        for name, host in HOSTS.items():
            tmp = tmp_path_factory.mktemp(name)
            make_store(tmp, stores[name])
            env = _fake_env(tmp, name)
            env["LLMMAN_PEERS"] = ", ".join(f"{h}:{ports[n]}" for n, h in HOSTS.items() if n != name)
            env["LLMMAN_INSECURE_REGISTRIES"] = env["LLMMAN_PEERS"] + f", {proxy.host}"  # the other's /v2/
            env["FAKE_PER_MODEL"] = json.dumps({f"{proxy.host}/": {"FAKE_LOAD_GATE": str(gate)}})
            nodes[name] = start_daemon(tmp, host=host, port=ports[name], extra_env=env)
            started.append(nodes[name])
        tmp = tmp_path_factory.mktemp("keyed")
        make_store(tmp, ("tiny",))
        keyed = start_daemon(tmp, extra_env={**_fake_env(tmp, "keyed"), "LLMMAN_API_KEYS": KEY})
        started.append(keyed)
        yield Pool(nodes, keyed, proxy, gate)
    finally:
        proxy.close()
        for d in started:
            for child in d.children():
                child.kill()
            d.stop(signal.SIGKILL if d.process.poll() is None else signal.SIGTERM)


@pytest.fixture(scope="module")
def browser(pool: Pool) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1500", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: Any, condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait for ``condition`` (reading the page) with the page's status line in the failure."""
    def check() -> bool:
        try:
            return condition()
        except Exception:  # an element replaced by the next poll between find and read
            return False
    try:
        wait_until(check, what, timeout=timeout)
    except AssertionError:
        status = driver.find_element("id", "status").text
        page = driver.find_element("tag name", "body").text[:3000]
        raise AssertionError(f"{what}: the page says {status!r}:\n{page}") from None


def click(driver: Any, selector: str) -> None:
    """Click the element ``selector`` finds, again if the next poll replaced it between find and click."""
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked() -> bool:
        try:
            driver.find_element("css selector", selector).click()
        except StaleElementReferenceException:
            return False
        return True

    wait_until(clicked, f"a click on {selector}", timeout=30)


def rows(driver: Any, table: str) -> list[list[str]]:
    """The text of each cell of each body row of the page's ``table``."""
    body = driver.find_element("css selector", f"#{table} tbody")
    return [[td.text for td in tr.find_elements("tag name", "td")]
            for tr in body.find_elements("tag name", "tr")]


def severe(driver: Any) -> list[str]:
    """The browser console's errors since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def ps(d: Daemon, **kw: Any) -> list[tuple[str, str]]:
    """``(name, node)`` of every loaded model in ``d``'s pool-wide ``/api/ps``."""
    r = httpx.get(d.url + "/api/ps", timeout=30, **kw)
    r.raise_for_status()
    return [(m["name"], m.get("node", "local")) for m in r.json()["models"]]


def node_cards(driver: Any) -> dict[str, str]:
    return {c.get_attribute("data-node"): c.get_attribute("data-state")
            for c in driver.find_elements("css selector", "#nodes .node")}


def test_the_files_are_open_and_load_nothing_from_elsewhere(pool: Pool) -> None:
    for d in (pool.nodes["alpha"], pool.keyed):
        for path, kind in (("/ui", "text/html"), ("/ui/app.js", "text/javascript"),
                           ("/ui/style.css", "text/css")):
            r = httpx.get(d.url + path, timeout=30)
            assert r.status_code == 200, (path, r.text)
            assert r.headers["content-type"].startswith(kind)
            assert r.headers["content-security-policy"].startswith("default-src 'self'")
        assert httpx.get(d.url + "/ui/nope.js", timeout=30).status_code == 404
        assert httpx.get(d.url + "/ui/..%2Fapp.py", timeout=30).status_code == 404
    html = httpx.get(pool.nodes["alpha"].url + "/ui", timeout=30).text
    assert "http://" not in html and "https://" not in html  # nothing named from outside
    assert httpx.get(pool.keyed.url + "/llmman/devices", timeout=30).status_code == 401  # data needs the key


def test_calls_on_a_node_pass_only_the_dashboards_calls_to_a_node_of_the_pool(pool: Pool) -> None:
    alpha, bravo = pool.nodes["alpha"], pool.nodes["bravo"]
    peer = bravo.url.removeprefix("http://")
    r = httpx.get(f"{alpha.url}/llmman/on/{peer}/api/tags", timeout=30)
    assert r.status_code == 200 and sorted(m["name"] for m in r.json()["models"]) == sorted(local_tags(bravo))
    assert httpx.get(f"{alpha.url}/llmman/on/bravo/api/tags", timeout=30).json() == r.json()  # by its name
    r = httpx.post(f"{alpha.url}/llmman/on/{peer}/api/chat", json={"model": "tiny"}, timeout=30)
    assert r.status_code == 404 and "error" in r.json()  # not one of the dashboard's calls
    r = httpx.get(f"{alpha.url}/llmman/on/127.0.0.9:1/api/tags", timeout=30)
    assert r.status_code == 404 and "no node" in r.json()["error"]
    r = httpx.get(f"{alpha.url}/llmman/on/alpha/api/tags", headers=HOP, timeout=30)  # this node: its own
    assert r.status_code == 307 and r.headers["location"] == "/api/tags"
    r = httpx.get(f"{alpha.url}/llmman/on/alpha/api/tags", headers=HOP, timeout=30, follow_redirects=True)
    assert r.status_code == 200 and sorted(m["name"] for m in r.json()["models"]) == sorted(local_tags(alpha))
    devices = httpx.get(alpha.url + "/llmman/devices?pool=1", timeout=30).json()["nodes"]
    assert [(n["name"], n["self"]) for n in devices] == [("alpha", True), ("bravo", False)]
    assert all(n["devices"] for n in devices)  # each lists its RAM at least (CPU nodes: no GPU figures)


def test_the_page_shows_both_nodes_and_a_model_loaded_on_the_peer(pool: Pool, browser: Any) -> None:
    alpha, bravo = pool.nodes["alpha"], pool.nodes["bravo"]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    r = httpx.post(bravo.url + "/api/chat", json=body, headers=HOP, timeout=60)
    assert r.status_code == 200, r.text
    browser.get(alpha.url + "/ui")
    until(browser, lambda: node_cards(browser) == {"alpha": "up", "bravo": "up"}, "both nodes shown up")
    # its slots come from the pool view, which shows the peer's load by the next background refresh
    until(browser, lambda: [TINY, "bravo", "2"] in [r[:2] + r[3:4] for r in rows(browser, "loaded")],
          "tiny shown loaded on bravo with its 2 slots")
    stored = sorted((row[0], row[1]) for row in rows(browser, "stored"))  # each node's store
    assert stored == [(BONLY, "bravo"), (COLD, "bravo"), (SOLO, "alpha"), (TINY, "alpha"), (TINY, "bravo")]
    assert severe(browser) == []


def test_load_and_unload_from_the_page_change_api_ps(pool: Pool, browser: Any) -> None:
    alpha = pool.nodes["alpha"]
    browser.get(alpha.url + "/ui")
    until(browser, lambda: any(row[0] == SOLO for row in rows(browser, "stored")), "solo listed")
    assert not any(name == SOLO for name, _ in ps(alpha))
    row = f"tr[data-model='{SOLO}'][data-node='alpha']"
    click(browser, f"#stored {row} button.load")
    wait_until(lambda: any(name == SOLO for name, _ in ps(alpha)), "solo loaded by the page")
    until(browser, lambda: any(r[0] == SOLO for r in rows(browser, "loaded")), "solo shown loaded")
    click(browser, f"#loaded {row} button.unload")
    wait_until(lambda: not any(name == SOLO for name, _ in ps(alpha)), "solo unloaded by the page")
    until(browser, lambda: not any(row[0] == SOLO for row in rows(browser, "loaded")),
          "solo gone from the page")
    assert severe(browser) == []


def test_load_unload_and_delete_on_the_peer_from_the_page(pool: Pool, browser: Any) -> None:
    alpha, bravo = pool.nodes["alpha"], pool.nodes["bravo"]
    browser.get(alpha.url + "/ui")  # bonly is bravo's alone: each call goes there through /llmman/on/
    row = f"#stored tr[data-model='{BONLY}'][data-node='bravo']"
    until(browser, lambda: bool(browser.find_elements("css selector", row)), "bonly listed on bravo")
    click(browser, row + " button.load")
    wait_until(lambda: BONLY in local_ps(bravo), "bonly loaded on bravo by alpha's page")
    assert BONLY not in local_ps(alpha)
    loaded = f"#loaded tr[data-model='{BONLY}'][data-node='bravo']"
    until(browser, lambda: bool(browser.find_elements("css selector", loaded)), "bonly shown loaded on bravo")
    click(browser, loaded + " button.unload")
    wait_until(lambda: BONLY not in local_ps(bravo), "bonly unloaded on bravo by alpha's page")
    click(browser, row + " button.delete")
    browser.switch_to.alert.accept()
    wait_until(lambda: BONLY not in local_tags(bravo), "bonly deleted from bravo's store by alpha's page")
    until(browser, lambda: not browser.find_elements("css selector", row), "bonly gone from the page")
    assert severe(browser) == []


def test_a_pull_from_the_page_shows_its_progress_on_either_node(pool: Pool, browser: Any) -> None:
    alpha, bravo = pool.nodes["alpha"], pool.nodes["bravo"]
    hosts = {name: d.url.removeprefix("http://") for name, d in pool.nodes.items()}
    browser.get(alpha.url + "/ui")
    until(browser, lambda: len(browser.find_elements("css selector", "#pull-node option")) == 2,
          "the pull form's nodes")
    for d, target, source, model in ((alpha, "alpha", "bravo", "tiny"), (bravo, "bravo", "alpha", "solo")):
        name = f"{hosts[source]}/ai/{model}:latest"  # from the other node's /v2/
        assert name not in local_tags(d)
        field = browser.find_element("id", "pull-name")
        field.clear()
        field.send_keys(name)
        click(browser, f"#pull-node option[value='{hosts[target]}']")
        click(browser, "#pull-submit")
        until(browser, lambda: browser.find_element("id", "pull-status").text == "success", f"{name} pulled")
        assert browser.find_element("id", "pull-progress").get_attribute("value") == "1"
        assert name in local_tags(d)  # on the node chosen (bravo's through /llmman/on/)
        until(browser, lambda n=name, t=target: [n, t] in [r[:2] for r in rows(browser, "stored")],
              f"{name} listed on {target}")
    assert severe(browser) == []


def test_the_request_log_shows_a_request_sent_by_the_test(pool: Pool, browser: Any) -> None:
    alpha, bravo = pool.nodes["alpha"], pool.nodes["bravo"]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "log me"}], "max_tokens": 3}
    r = httpx.post(bravo.url + "/v1/chat/completions", json=body, headers=HOP, timeout=60)
    assert r.status_code == 200, r.text
    browser.get(alpha.url + "/ui")  # alpha's page shows bravo's log through pool=1

    def shown() -> bool:
        return any(row[1] == "bravo" and row[2] == "/v1/chat/completions" and row[4] == "200"
                   for row in rows(browser, "requests"))

    def pooled() -> list[dict[str, Any]]:
        return list(httpx.get(alpha.url + "/llmman/requests?pool=1", timeout=30).json()["requests"])

    wait_until(lambda: any(row["route"] == "/v1/chat/completions" for row in pooled()),
               "bravo's row in alpha's pool log")
    mine = httpx.get(alpha.url + "/llmman/requests", timeout=30).json()["requests"]
    assert not any(row["node"] == "bravo" for row in mine)  # without pool=1: this node's log alone
    stats = httpx.get(alpha.url + "/llmman/stats?pool=1", timeout=30).json()["stats"]
    assert any(s["node"] == "bravo" and s["model"] == TINY for s in stats)
    until(browser, shown, "bravo's /v1/chat/completions row in alpha's page")
    until(browser, lambda: any(row[1] == "bravo" for row in rows(browser, "stats")), "bravo's stats shown")
    assert browser.find_elements("css selector", "#chart-tps polyline, #chart-tps circle")
    if os.environ.get("LLMMAN_DASHBOARD_SHOT"):  # more answers on both nodes, so that the charts have a line
        for i in range(6):
            d = (alpha, bravo)[i % 2]
            httpx.post(d.url + "/api/chat", headers=HOP, timeout=60, json={
                "model": "tiny", "messages": [{"role": "user", "content": f"hi {i}"}], "stream": True,
            }).raise_for_status()  # streamed: each has a time to first token for its chart
        until(browser, lambda: len(rows(browser, "requests")) >= 12 and len(rows(browser, "loaded")) == 2,
              "the log and both loads shown")
    browser.find_element("id", "f-node").send_keys("alpha")
    browser.execute_script("document.getElementById('filters').dispatchEvent(new Event('change'))")
    until(browser, lambda: not any(row[1] == "bravo" for row in rows(browser, "requests")),
          "the node filter hides bravo's rows")
    assert severe(browser) == []


def test_a_keyed_daemon_asks_for_the_key_and_keeps_it_in_the_session(pool: Pool, browser: Any) -> None:
    d = pool.keyed
    httpx.post(d.url + "/api/generate", json={"model": "tiny", "keep_alive": "5m"}, timeout=60,
               headers={"Authorization": f"Bearer {KEY}"}).raise_for_status()
    browser.get(d.url + "/ui")
    until(browser, lambda: browser.find_element("id", "login").is_displayed(), "the login form shown")
    assert not browser.find_element("id", "main").is_displayed()
    browser.find_element("id", "login-key").send_keys("wrong")
    browser.find_element("id", "login-submit").click()
    until(browser, lambda: "refused" in browser.find_element("id", "login-error").text, "a wrong key refused")
    browser.find_element("id", "login-key").send_keys(KEY)
    browser.find_element("id", "login-submit").click()
    until(browser, lambda: node_cards(browser) == {"keyed": "up"}, "the node shown after logging in")
    until(browser, lambda: any(row[0] == TINY for row in rows(browser, "loaded")), "tiny shown")
    assert browser.execute_script("return sessionStorage.getItem('llmman.key')") == KEY
    assert browser.execute_script("return localStorage.length") == 0
    assert KEY not in browser.current_url
    errors = severe(browser)
    assert errors and all("401" in e for e in errors), errors  # only the refused calls
    browser.find_element("id", "logout").click()
    until(browser, lambda: browser.find_element("id", "login").is_displayed(), "logged out")
    assert browser.execute_script("return sessionStorage.getItem('llmman.key')") is None


def test_a_cold_start_shows_its_pull_then_its_load(pool: Pool, browser: Any) -> None:
    alpha = pool.nodes["alpha"]
    name = f"{pool.proxy.host}/ai/cold:latest"  # bravo's cold, through the proxy: held at its blobs
    row = f"#progress tr[data-model='{name}'][data-node='alpha']"

    def shown() -> tuple[str, str, str] | None:
        found = browser.find_elements("css selector", row)
        if not found:
            return None
        tr = found[0]
        return (str(tr.get_attribute("data-kind")), tr.find_element("css selector", ".what").text,
                tr.find_element("css selector", ".amount").text)

    browser.get(alpha.url + "/ui")
    until(browser, lambda: browser.find_element("id", "progress-none").is_displayed(), "nothing in progress")
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    outcome: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: outcome.append(
        httpx.post(alpha.url + "/api/chat", json=body, headers=HOP, timeout=120)))
    worker.start()
    try:
        wait_until(pool.proxy.held.is_set, "the pull's blob requests held")
        pulling = ("pull", f"pulling from {pool.proxy.host}")
        until(browser, lambda: (s := shown()) is not None and s[:2] == pulling
              and s[2].startswith("0 % · 0 B / "), "the pull shown in progress with its bar")
        assert not browser.find_element("id", "progress-none").is_displayed()
        pool.proxy.release()
        until(browser, lambda: shown() == ("load", "loading on alpha", ""), "the load shown on alpha")
        shot = os.environ.get("LLMMAN_DASHBOARD_SHOT")
        if shot:  # the whole page, a cold start in progress and the log of the tests before
            until(browser, lambda: len(rows(browser, "requests")) >= 12, "the log shown")
            browser.save_screenshot(shot)
        pool.gate.touch()
        worker.join(timeout=120)
    finally:
        pool.proxy.release()
        pool.gate.touch()
    assert outcome and outcome[0].status_code == 200, outcome and outcome[0].text
    until(browser, lambda: shown() is None, "the cold start gone from the table once it answered")
    assert severe(browser) == []
