#!/usr/bin/env python3
"""The course site's serving page against a running serve_gpt, in headless Chromium.

usage: check_serving_page.py --serve SERVE_GPT --checkpoint DIR --site HTML_DIR --screenshots DIR

Starts serve_gpt on a free port of 127.0.0.1 (each step paced to 30 ms, so that the blocks can
be seen in use), opens the page with ?server= pointing at it, and checks: nothing is sent to
the server before a button is pressed; "send four at once" streams four completions, each
of max_tokens characters after the prompt, ending with [DONE]; while they run the pool shows
blocks in use, in at least two requests' colours; when they end, every block is free again;
the server counted four requests and their tokens; the page logged no error. A screenshot
of the page with the four texts goes to the screenshots folder.
"""
import argparse
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_site  # noqa: E402  (the same browser, as the site check starts it)

MAX_TOKENS = 40


def metrics(port):
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        values = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--site", type=Path, required=True)
    parser.add_argument("--screenshots", type=Path, required=True)
    args = parser.parse_args()
    page = args.site.resolve() / "serving_page.html"
    if not page.is_file():
        check_site.fail(f"no serving page at {page} (./workbook docs builds the site)")
    server = subprocess.Popen([str(args.serve), str(args.checkpoint), "--port", "0", "--step-ms", "30",
                               "--max-running", "4", "--allow-origin", "null",
                               # Chromium started with --allow-file-access-from-files sends file://
                               "--allow-origin", "file://"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    problems = []
    try:
        line = server.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            check_site.fail(f"serve_gpt did not start: {line.strip()} {server.stdout.read()[:400]}")
        port = int(m.group(1))
        import tempfile
        with tempfile.TemporaryDirectory(prefix="check_serving_") as profile:
            driver = check_site.start_browser(profile)
            try:
                driver.get(page.as_uri() + f"?server=http://127.0.0.1:{port}")
                time.sleep(1.0)
                if metrics(port)["serve_requests_total"] != 0:
                    problems.append("the page sent a request before any button was pressed")
                problems += check_site.console_problems(driver, [])
                driver.execute_script(f"document.getElementById('sp-max').value = '{MAX_TOKENS}';")
                prompt = driver.execute_script("return document.getElementById('sp-prompt').value;")
                driver.find_element("id", "sp-send4").click()
                most_used, colours = 0, set()
                deadline = time.time() + 60
                while time.time() < deadline:
                    state = driver.execute_script("""
                        var used = document.querySelectorAll('#sp-pool .sp-used');
                        var colours = Array.prototype.map.call(used, function (c) { return c.style.background; });
                        return {used: used.length, colours: colours,
                                done: document.querySelectorAll('#sp-texts .sp-done').length};""")
                    most_used = max(most_used, state["used"])
                    colours.update(state["colours"])
                    if state["done"] == 4:
                        break
                    time.sleep(0.05)
                texts = driver.execute_script(
                    "return Array.prototype.map.call(document.querySelectorAll('#sp-texts .sp-text'),"
                    " function (e) { return e.textContent; });")
                if len(texts) != 4:
                    problems.append(f"four requests sent, {len(texts)} texts shown")
                for i, t in enumerate(texts):
                    if not t.startswith(prompt) or len(t) != len(prompt) + MAX_TOKENS:
                        problems.append(f"text {i + 1} is {len(t)} characters, not the prompt and {MAX_TOKENS} more: {t!r}")
                if most_used == 0:
                    problems.append("the pool never showed a block in use while the requests ran")
                if len(colours) < 2:
                    problems.append(f"the blocks in use showed {len(colours)} request colours; four requests ran")
                # every block free again once the last request ended
                deadline = time.time() + 10
                free_again = False
                while time.time() < deadline and not free_again:
                    free_again = driver.execute_script(
                        "return document.querySelectorAll('#sp-pool .sp-used').length === 0 &&"
                        " /^0 of /.test(document.getElementById('sp-pool-caption').textContent);")
                    time.sleep(0.1)
                if not free_again:
                    caption = driver.execute_script("return document.getElementById('sp-pool-caption').textContent;")
                    problems.append(f"after the requests ended the pool still shows blocks in use: {caption}")
                m = metrics(port)
                if m["serve_requests_total"] != 4 or m["serve_tokens_total"] != 4 * MAX_TOKENS:
                    problems.append(f"the server counted {m['serve_requests_total']:.0f} requests and "
                                    f"{m['serve_tokens_total']:.0f} tokens; the page sent 4 of {MAX_TOKENS}")
                problems += check_site.console_problems(driver, [])
                args.screenshots.mkdir(parents=True, exist_ok=True)
                check_site.screenshot(driver, args.screenshots / "serving_page.png")
                print(f"four streams of {MAX_TOKENS} characters; at most {most_used} blocks in use at once, "
                      f"in {len(colours)} colours; all free at the end")
            finally:
                driver.quit()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    if server.returncode != 0:
        problems.append(f"serve_gpt exited {server.returncode} after SIGTERM")
    for p in problems:
        print(f"FAIL serving_page.html: {p}")
    if problems:
        return 1
    print("the serving page streams from a running server and shows its blocks fill and free")
    return 0


if __name__ == "__main__":
    sys.exit(main())
