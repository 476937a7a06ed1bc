"""A headless Chromium for the dashboard's tests, driven line by line.

Reads one JSON command a line on standard input and answers each with one
JSON line: {"ok": value} or {"error": text}. It drives Debian's chromium
through Debian's chromedriver (never a browser a tool downloads).
Commands: get, text, texts, count, click_button, fill, exec, title, url,
source, screenshot, new_window, new_tab, windows, switch, quit.
"""
import json
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def start():
    o = webdriver.ChromeOptions()
    o.binary_location = "/usr/bin/chromium"
    for flag in [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync",
        "--window-size=1280,900",
        "--user-data-dir=" + tempfile.mkdtemp(prefix="taskq-chromium-"),
    ]:
        o.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=o)


def run(d, c):
    op = c["op"]
    if op == "get":
        d.get(c["url"])
        return d.current_url
    # Read in one script, so a refresh of the page between finding an element
    # and reading it cannot leave a stale reference.
    if op == "text":
        return d.execute_script(
            "const e = document.querySelector(arguments[0]);"
            "return e ? e.innerText.trim() : null;", c["css"])
    if op == "texts":
        return d.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]),"
            " e => e.innerText.trim());", c["css"])
    if op == "count":
        return d.execute_script(
            "return document.querySelectorAll(arguments[0]).length;", c["css"])
    if op == "click_button":
        for b in d.find_elements(By.TAG_NAME, "button"):
            if b.text.strip() == c["text"]:
                b.click()
                return True
        raise Exception("no button named %r" % c["text"])
    if op == "fill":
        e = d.find_element(By.CSS_SELECTOR, c["css"])
        e.clear()
        e.send_keys(c["value"])
        return True
    if op == "exec":
        return d.execute_script(c["js"])
    if op == "exec_async":
        return d.execute_async_script(c["js"])
    if op == "title":
        return d.title
    if op == "url":
        return d.current_url
    if op == "source":
        return d.page_source
    if op == "screenshot":
        return d.save_screenshot(c["path"])
    if op == "new_window":
        d.switch_to.new_window("window")
        return d.current_window_handle
    if op == "new_tab":
        # A tab in the same window: the one it covers becomes hidden.
        d.switch_to.new_window("tab")
        return d.current_window_handle
    if op == "windows":
        return d.window_handles
    if op == "switch":
        d.switch_to.window(c["handle"])
        return True
    raise Exception("unknown op %r" % op)


def main():
    d = start()
    print(json.dumps({"ok": "ready"}), flush=True)
    try:
        for line in sys.stdin:
            c = json.loads(line)
            if c["op"] == "quit":
                break
            try:
                out = {"ok": run(d, c)}
            except Exception as e:  # reported to the test, which decides
                out = {"error": "%s: %s" % (type(e).__name__, e)}
            print(json.dumps(out), flush=True)
    finally:
        d.quit()


main()
