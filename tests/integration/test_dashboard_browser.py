"""The dashboard in a real browser: headless Chromium from the system's packages, driven by Selenium.

Nothing is downloaded: Selenium is pointed at /usr/bin/chromium and /usr/bin/chromedriver (Debian's `chromium`
and `chromium-driver`, which .ci/run installs). On a machine without them these tests are skipped, saying why.
A real broker, real worker processes and a fair pool under load; every wait is on a condition in the page.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import cronoq
from tests.support import ROOT, free_port, start_worker_process

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# The README's screenshot: this test takes it on every run, and writes it there when asked to
# (`CRONOQ_SCREENSHOT=1 python3 -m pytest tests/integration/test_dashboard_browser.py`), so that a test run
# leaves the checkout as it found it.
SCREENSHOT = ROOT / "docs" / "images" / "dashboard-tenants.png"
WAIT = 45.0

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver): "
           "apt-get install chromium chromium-driver (.ci/run does)",
)

POOLS = """
[[pools]]
name = "llm"
[pools.tenant_weights]
acme = 3
globex = 1
"acme/search" = 2
"acme/ads" = 1
[pools.tenant_limits]
acme = 10                 # never reached with 4 slots: the page shows it, the shares stay the weights'

[[pools]]
name = "failing"
"""
TOKENS = {"T_ADMIN": "admin-secret", "T_VIEWER": "viewer-secret", "T_CLIENT": "client-secret"}
TOKENS_TOML = "".join(f'\n[[auth.tokens]]\ntoken_env = "{env}"\nrole = "{role}"\n'
                      for env, role in (("T_ADMIN", "admin"), ("T_VIEWER", "viewer"), ("T_CLIENT", "client")))
# Enough for a minute of work at 80 tasks a second: the pool stays busy however slowly the machine runs the test.
BACKLOG = {"acme/search": 1500, "acme/ads": 1500, "globex": 1500}


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,720", f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER), log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "chromium", ignore_errors=True)


@pytest.fixture
def workers(tmp_path):
    started: list[subprocess.Popen] = []

    def start(broker, count: int = 2, env: dict[str, str] | None = None) -> None:
        for n in range(count):
            started.append(start_worker_process(broker.workers, "tests.apps.dashboard:pools",
                                                tmp_path / f"worker{len(started)}.log", concurrency=2, env=env,
                                                extra=["--token-env", "T_WORKER"] if env else None, cwd=ROOT))

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def load(broker, token: str | None = None) -> str:
    """Queue the backlog (all at once: the client batches what it sends in one turn) and one task that fails;
    returns the failed task's id once it has failed."""

    async def run() -> str:
        async with cronoq.connect(broker.clients, token=token) as client:
            await asyncio.gather(*[client.submit(i, pool="llm", tenant=tenant)
                                   for tenant, count in BACKLOG.items() for i in range(count)])
            failed = await client.submit("not a prompt", pool="failing", tenant="acme")
            with pytest.raises(cronoq.TaskFailed):
                await failed.result(timeout=WAIT)
            return failed.id

    return asyncio.run(run())


def wait(driver, condition, what: str):
    """Wait until `condition(driver)` is truthy (re-trying when the page redrew under it); fail naming `what`."""
    def attempt(d):
        try:
            return condition(d)
        except StaleElementReferenceException:
            return False

    return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(attempt, message=f"waiting until {what}")


def click(driver, selector: str, what: str) -> None:
    """Click the element `selector` names. The page redraws its tables on every refresh, so an element found
    just before one is stale by the click (which then did not happen): find it again and click that."""
    def attempt(d):
        d.find_element(By.CSS_SELECTOR, selector).click()
        return True

    wait(driver, attempt, what)


def text_of(driver, selector: str) -> str:
    """The text of the first element `selector` names ("" if none). The page redraws its tables on every refresh:
    an element found just before one is stale when read, so it is found again and read again."""
    for _ in range(20):
        elements = driver.find_elements(By.CSS_SELECTOR, selector)
        try:
            return elements[0].text if elements else ""
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} was redrawn under every one of 20 reads")


def show(driver, view: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'#tabs button[data-view="{view}"]').click()
    wait(driver, lambda d: d.find_element(By.ID, f"view-{view}").is_displayed(), f"the {view} view shows")


def percent(text: str) -> float:
    return float(text.replace("%", "").strip())


@pytest.mark.long_running  # about 20-30 s: started first, so the run does not end waiting for it
def test_pools_tenants_workers_and_failures_appear_update_and_pause_works(broker_factory, workers, browser,
                                                                           tmp_path):
    port = free_port()
    broker = broker_factory(POOLS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    workers(broker, 2)
    failed_id = load(broker)
    browser.get(f"http://127.0.0.1:{port}/")

    # Pools: the llm pool with its backlog, and the backlog shrinking as the page updates.
    row = '#pools tr[data-pool="llm"]'
    wait(browser, lambda d: text_of(d, f"{row} td.queued") not in ("", "0"), "the llm pool shows its backlog")
    assert "fair" in text_of(browser, f"{row} td.state") and text_of(browser, f"{row} td.workers") == "2"
    first = text_of(browser, f"{row} td.queued")
    wait(browser, lambda d: text_of(d, f"{row} td.queued") not in (first, ""), "the queued count updates")

    # A tab click keeps the tab bar in sight, however short the window (a #hash of the table's id scrolled to it).
    browser.set_window_size(1280, 260)
    browser.execute_script("window.scrollTo(0, 0)")
    show(browser, "tenants")
    assert browser.execute_script("return window.scrollY") == 0, "the tab click scrolled the tab bar away"
    assert browser.execute_script("return location.hash") == "#tenants"
    browser.set_window_size(1280, 720)

    # Tenants: the tree, both top-level tenants with their shares against their weighted shares, updating.
    rows = {tenant: f'#tenants tr[data-tenant="{tenant}"]' for tenant in ("acme", "acme/search", "acme/ads", "globex")}
    wait(browser, lambda d: all(d.find_elements(By.CSS_SELECTOR, r) for r in rows.values()), "every tenant shows")
    assert text_of(browser, f'{rows["acme"]} td.weighted') == "75.0 %"
    assert text_of(browser, f'{rows["globex"]} td.weighted') == "25.0 %"
    assert text_of(browser, f'{rows["acme/search"]} td.weighted') == "50.0 %"
    assert text_of(browser, f'{rows["acme/search"]} td.name') == "search"  # indented under acme
    assert text_of(browser, f'{rows["acme"]} td.ceiling').endswith("/ 10")
    wait(browser, lambda d: "last" in text_of(d, "#share-window") and percent(text_of(d, f'{rows["acme"]} td.share'))
         > percent(text_of(d, f'{rows["globex"]} td.share')) > 0, "the recent shares follow the weights")
    queued = text_of(browser, f'{rows["globex"]} td.queued')
    wait(browser, lambda d: text_of(d, f'{rows["globex"]} td.queued') not in (queued, ""), "the tenants update")
    # The shares over time: a line per top-level tenant, its weighted share dashed beside it, and the dispatch rate.
    for tenant in ("acme", "globex"):
        line = f'#share-chart polyline.share-line[data-tenant="{tenant}"]'
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, line), f"{tenant}'s share is drawn over time")
        assert browser.find_elements(By.CSS_SELECTOR, f'#share-chart polyline.promised-line[data-tenant="{tenant}"]')
    assert browser.find_elements(By.CSS_SELECTOR, "#share-chart polyline.rate-line")
    wait(browser, lambda d: "acme" in text_of(d, "#share-chart .series-legend") and "(now " in text_of(d, "#rate-now"),
         "the chart's legend and the pool's rate show")
    browser.execute_script("document.getElementById('share-chart').scrollIntoView()")
    chart_shot = tmp_path / "dashboard-chart.png"
    assert browser.save_screenshot(str(chart_shot)) and chart_shot.stat().st_size > 0
    browser.execute_script("window.scrollTo(0, 0)")
    screenshot = SCREENSHOT if os.environ.get("CRONOQ_SCREENSHOT") else tmp_path / SCREENSHOT.name
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 0

    # Workers: both, with their pools and slots.
    show(browser, "workers")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#workers tbody tr")) == 2, "both workers show")
    assert text_of(browser, "#workers tbody tr td.pools") == "llm, failing"
    assert text_of(browser, "#workers tbody tr td.slots").endswith("/ 2")

    # Failures: the failed task, and its traceback on click.
    show(browser, "failures")
    failure = f'#failures tr[data-task="{failed_id}"]'
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, failure), "the failed task shows")
    assert "ValueError" in text_of(browser, failure) and "not a prompt" in text_of(browser, failure)
    click(browser, failure, "the failed task can be clicked")
    wait(browser, lambda d: "in _check" in d.find_element(By.ID, "traceback").text, "its traceback shows")

    # A task by id.
    show(browser, "task")
    browser.find_element(By.ID, "task-id").send_keys(failed_id)
    browser.find_element(By.ID, "task-lookup").click()
    wait(browser, lambda d: text_of(d, '#task-view tr[data-field="state"] td') == "failed", "the task's state shows")
    assert text_of(browser, '#task-view tr[data-field="attempts"] td') == "1"

    # Pause from the page, and resume.
    show(browser, "pools")
    click(browser, f"{row} button.pause", "the pool's pause button can be clicked")
    wait(browser, lambda d: text_of(d, f"{row} td.state").startswith("paused"), "the pool shows paused")
    with cronoq.connect_sync(broker.clients) as client:
        assert client.stats()["pools"]["llm"]["paused"]
    click(browser, f"{row} button.resume", "the pool's resume button can be clicked")
    wait(browser, lambda d: text_of(d, f"{row} td.state").startswith("running"), "the pool shows running again")
    assert "cronoq" in browser.title


def log_in(driver, token: str) -> None:
    box = driver.find_element(By.ID, "token-input")
    box.clear()
    box.send_keys(token)
    driver.find_element(By.ID, "token-submit").click()


def test_the_page_asks_for_a_token_and_a_viewer_cannot_pause(broker_factory, workers, browser):
    port = free_port()
    env = {**TOKENS, "T_WORKER": "admin-secret"}
    broker = broker_factory(POOLS + TOKENS_TOML, env=TOKENS, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    workers(broker, 1, env=env)
    load(broker, token="admin-secret")
    browser.get(f"http://127.0.0.1:{port}/")
    wait(browser, lambda d: d.find_element(By.ID, "login").is_displayed(), "the page asks for a token")
    assert not browser.find_element(By.ID, "views").is_displayed()

    log_in(browser, "not-a-token")
    wait(browser, lambda d: "unknown token" in text_of(d, "#token-error"), "an unknown token is refused")
    log_in(browser, "client-secret")
    wait(browser, lambda d: "viewer or admin" in text_of(d, "#token-error"), "a client token is refused")

    log_in(browser, "viewer-secret")
    row = '#pools tr[data-pool="llm"]'
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row), "a viewer sees the pools")
    assert "viewer" in text_of(browser, "#role")
    assert not browser.find_elements(By.CSS_SELECTOR, f"{row} button"), "a viewer is offered no action"
    stored = browser.execute_script("return [sessionStorage.getItem('cronoq-token'), localStorage.length]")
    assert stored == ["viewer-secret", 0]  # this tab only: never in localStorage

    browser.find_element(By.ID, "forget-token").click()
    wait(browser, lambda d: d.find_element(By.ID, "login").is_displayed(), "the token is forgotten")
    log_in(browser, "admin-secret")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{row} button.pause"), "an admin may pause")
    click(browser, f"{row} button.pause", "the pool's pause button can be clicked")
    wait(browser, lambda d: text_of(d, f"{row} td.state").startswith("paused"), "the pool shows paused")
    with cronoq.connect_sync(broker.clients, token="admin-secret") as admin:
        assert admin.stats()["pools"]["llm"]["paused"]


def test_a_viewer_pinned_to_a_tenant_sees_its_subtree_only(broker_factory, workers, browser, tmp_path):
    port = free_port()
    tokens = {**TOKENS, "T_ACME": "acme-viewer"}
    pinned = '\n[[auth.tokens]]\ntoken_env = "T_ACME"\nrole = "viewer"\ntenant = "acme"\n'
    broker = broker_factory(POOLS + TOKENS_TOML + pinned, env=tokens, broker_extra=f'dashboard = "127.0.0.1:{port}"')
    workers(broker, 1, env={**tokens, "T_WORKER": "admin-secret"})
    load(broker, token="admin-secret")
    browser.get(f"http://127.0.0.1:{port}/")
    wait(browser, lambda d: d.find_element(By.ID, "login").is_displayed(), "the page asks for a token")
    log_in(browser, "acme-viewer")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#pools tr[data-pool="llm"]'), "the pools show")
    assert text_of(browser, "#role") == "viewer (read-only) of acme only"
    show(browser, "tenants")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#tenants tr[data-tenant="acme/search"]'),
         "acme's tree shows")
    # Read in one script: rows found first and read one by one can be redrawn in between (a refresh under load).
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tenants tbody tr'), row => row.getAttribute('data-tenant'))")
    assert shown == ["acme", "acme/ads", "acme/search"]  # no globex
    assert text_of(browser, '#tenants tr[data-tenant="acme"] td.weighted') == "100.0 %"
    assert browser.save_screenshot(str(tmp_path / "pinned-tenants.png"))
    show(browser, "workers")
    wait(browser, lambda d: text_of(d, "#workers tbody tr td.slots") == "– / 2",
         "a worker shows without its busy slots")
    show(browser, "failures")
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#failures tbody tr"), "acme's failure shows")
    assert "globex" not in browser.find_element(By.TAG_NAME, "body").text
