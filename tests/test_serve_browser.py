"""The web page in a real headless browser (Debian's chromium driven by Selenium): give a key once, ask the agent, see
its tool calls, give a thumbs up and a correct answer, and find the feedback in the store under the key's user.
Skipped where chromium or selenium is missing, except in CI (CI=true), where it fails instead."""

import os
import shutil

import pytest

from helpers.serve.process import ServerProcess
from helpers.serve.store import SQLiteStore

CHROMEDRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None

missing = webdriver is None or CHROMEDRIVER is None
if missing and os.environ.get("CI") != "true":
    pytest.skip("needs selenium and chromium-driver (apt-get install chromium chromium-driver)", allow_module_level=True)


@pytest.fixture
def browser():
    assert not missing, "CI must have selenium and chromium-driver (.ci/run installs them)"
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def ask_in_page(driver, wait, question: str) -> None:
    box = driver.find_element(By.ID, "question")
    box.clear()
    box.send_keys(question)
    driver.find_element(By.ID, "send").click()
    wait.until(EC.visibility_of_element_located((By.ID, "feedback")))


def give_key(driver, key: str) -> None:
    box = driver.find_element(By.ID, "key")
    box.clear()
    box.send_keys(key)
    driver.find_element(By.ID, "use-key").click()


def test_ask_see_the_tool_calls_and_give_feedback_in_a_browser(tmp_path, browser):
    with ServerProcess(tmp_path / "store.db") as server:
        wait = WebDriverWait(browser, 120)
        browser.get(server.url + "/")
        assert browser.find_element(By.ID, "login").is_displayed() and not browser.find_element(By.ID, "ask").is_displayed()
        give_key(browser, "wb-not-a-key")  # a wrong key: the server's 401, and the page asks again
        browser.find_element(By.ID, "send").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "status"), "401"))
        assert browser.find_element(By.ID, "login").is_displayed()
        give_key(browser, server.auth("browser-user")["Authorization"].removeprefix("Bearer "))
        browser.refresh()  # the key is asked for once: the tab keeps it (sessionStorage)
        assert browser.find_element(By.ID, "ask").is_displayed() and not browser.find_element(By.ID, "login").is_displayed()

        ask_in_page(browser, wait, "What do 3 of my usual items cost?")
        turns = browser.find_elements(By.CSS_SELECTOR, "#episode .turn")
        assert turns and turns[-1].text.startswith("assistant:")
        assert any("<tool_call>" in t.text for t in browser.find_elements(By.CSS_SELECTOR, "#episode .assistant")), \
            [t.text for t in turns]  # the agent's tool calls are shown ...
        assert browser.find_elements(By.CSS_SELECTOR, "#episode .tool")  # ... and what the tools replied
        first = browser.find_element(By.ID, "status").text.removeprefix("episode ")
        browser.find_element(By.ID, "up").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "status"), "saved"))
        browser.find_element(By.ID, "down").click()  # a second vote on the same episode is refused, and said so
        wait.until(EC.text_to_be_present_in_element((By.ID, "status"), "409"))

        ask_in_page(browser, wait, "What do 4 of my usual items cost?")
        second = browser.find_element(By.ID, "status").text.removeprefix("episode ")
        browser.find_element(By.ID, "correct").send_keys("forty")  # not a number: the page shows the server's 422
        browser.find_element(By.ID, "send-correct").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "status"), "422"))
        browser.find_element(By.ID, "correct").clear()
        browser.find_element(By.ID, "correct").send_keys("1,000")  # the server writes it as 1000
        browser.find_element(By.ID, "send-correct").click()
        wait.until(EC.text_to_be_present_in_element((By.ID, "status"), "saved"))

        stored = {f["episode_id"]: f for f in SQLiteStore(tmp_path / "store.db").feedback_since(0)}
        assert stored[first]["rating"] == 1 and stored[first]["user"] == "browser-user"
        assert stored[second]["correct_answer"] == "1000" and stored[second]["rating"] is None
