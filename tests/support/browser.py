"""A real headless browser for tests: Debian's chromium driven through chromedriver by selenium.

Chromium runs headless with a fresh profile in a temporary directory, no sandbox (tests often run as root
in containers), and every background service that would try to reach the internet switched off. Selenium
is pointed at Debian's chromedriver explicitly so Selenium Manager never tries to download a driver.
Install: `apt-get install chromium chromium-driver` and `pip install selenium`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.tools import require_tool

__all__ = ["chromium", "text_of", "wait_for"]

_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--password-store=basic",
    "--window-size=1400,1800",
)


@contextmanager
def chromium() -> Iterator[Any]:
    """A selenium WebDriver on headless chromium, quit (and its profile removed) when the block ends."""
    install = "apt-get install chromium chromium-driver"
    binary = require_tool("chromium", install)
    driver_path = require_tool("chromedriver", install)
    # optional dependency: selenium (dev extra); without it this module still imports and the checks above run
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for downloads
    profile = tempfile.mkdtemp(prefix="tiergate-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in _FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    service = Service(executable_path=driver_path, log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str, timeout_s: float = 20.0) -> Any:
    """Poll `condition(driver)` until it returns something truthy; fail naming `what` and showing the page."""
    # optional dependency: selenium (dev extra), as in chromium()
    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def safe(d: Any) -> Any:
        try:
            return condition(d)
        except WebDriverException:
            return False  # the element is being re-rendered; try again

    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.1).until(safe)
    except TimeoutException:
        body = driver.find_element("tag name", "body").text[:3000]
        raise AssertionError(f"timed out waiting for {what}; the page shows:\n{body}") from None


def text_of(driver: Any, css: str) -> str:
    """The visible text of the first element matching `css` ("" when there is none)."""
    found = driver.find_elements("css selector", css)
    return found[0].text if found else ""
