#!/usr/bin/python3
"""The course site as a reader sees it, in headless Chromium.

Usage: check_site.py --build BUILD --site HTML --outputs OUTPUT_DIR --screenshots DIR

Builds the `docs` target (nothing to do when it is up to date), then opens every page of the
site after MathJax has typeset it, and fails, naming the page and the element, on
  - a formula MathJax could not typeset (an undefined control sequence, a missing argument,
    "Math Processing Error") or a formula left as raw TeX;
  - an image that does not load, a link inside the site to a file or an anchor that does not
    exist, a script error or a failed load in the console;
  - a lesson page without the output its program printed (OUTPUT_DIR/lessonNN.txt);
  - an attention inspector that does not draw one map per layer and head, or does not change
    what it highlights when another head or query is chosen; for lesson 17's encoder-decoder,
    one that does not draw each of its three attentions (encoder, decoder, cross) with the
    chosen query's weights as the data holds them; a site without either inspector.
It keeps a full-page screenshot of each lesson page and of the inspectors in DIR.

Needs Debian's chromium, chromium-driver and python3-selenium (`./workbook setup` installs
them); runs without a network, without a display, and as root.
"""
import argparse
import base64
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WIDTH = 1280
MAX_SCREENSHOT_HEIGHT = 16000  # Chromium's captures get unreliable beyond ~16k pixels

# Runs before any script of every page: records the elements whose resource (image, script,
# stylesheet) failed to load.
RECORDER = r"""
window.__site = {failed: []};
window.addEventListener('error', function (e) {
  var t = e.target;
  if (t && t !== window && t.tagName)
    window.__site.failed.push('<' + t.tagName.toLowerCase() + '> ' + (t.src || t.href || ''));
}, true);
"""

# Waits until MathJax has finished typesetting the page (or finds the page has no MathJax).
WAIT_FOR_MATHJAX = r"""
var done = arguments[arguments.length - 1], start = Date.now();
(function wait() {
  if (window.MathJax && MathJax.Hub && MathJax.Hub.Register) {
    MathJax.Hub.Register.StartupHook('End', function () {
      MathJax.Hub.Queue(function () { done('typeset'); });
    });
  } else if (!document.querySelector('script[src*="MathJax.js"]')) {
    done('none');
  } else if (Date.now() - start > 30000) {
    done('MathJax did not start within 30 s');
  } else {
    setTimeout(wait, 25);
  }
})();
"""

# What a page holds once typeset: its problems, its links and its anchors.
INSPECT_PAGE = r"""
var problems = [];
function describe(el) {
  var s = el.tagName.toLowerCase();
  if (el.id) s += '#' + el.id;
  var h = null, n = el;
  // the nearest heading before the element, to say where on the page it is
  while (n && !h) {
    var p = n.previousElementSibling;
    while (p && !/^H[1-6]$/.test(p.tagName)) p = p.previousElementSibling;
    if (p) h = p; else n = n.parentElement;
  }
  if (h) s += ' in section "' + h.textContent.trim().slice(0, 60) + '"';
  return s;
}
function mmlText(node) {
  try { return String(node); } catch (e) { return '?'; }
}
function findErrors(node, out) {
  if (!node || typeof node !== 'object') return;
  if (node.type === 'merror') { out.push(mmlText(node)); return; }
  if (node.data && node.data.length) for (var i = 0; i < node.data.length; ++i) findErrors(node.data[i], out);
}
if (window.MathJax && MathJax.Hub && MathJax.Hub.getAllJax) {
  MathJax.Hub.getAllJax().forEach(function (jax) {
    var errs = [];
    findErrors(jax.root, errs);
    errs.forEach(function (m) {
      problems.push('MathJax error "' + m + '" in the formula ' + JSON.stringify(jax.originalText.trim()) +
                    ' (' + describe(jax.SourceElement().parentElement) + ')');
    });
  });
}
document.querySelectorAll('.MathJax_Error, [data-mjx-error]').forEach(function (e) {
  problems.push('MathJax: "' + e.textContent.trim() + '" (' + describe(e) + ')');
});
// TeX that nobody typeset: MathJax missing, or delimiters it did not recognise.
var walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
  acceptNode: function (t) {
    return t.parentElement.closest('pre, code, script, style, .fragment, textarea') ?
      NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT;
  }});
for (var t = walker.nextNode(); t; t = walker.nextNode()) {
  var m = /\\[\(\[]|\\f[\$\[]/.exec(t.data);
  if (m) problems.push('raw TeX "' + t.data.trim().slice(0, 80) + '" was not typeset (' + describe(t.parentElement) + ')');
}
// Uncaught script errors reach the console, which the caller reads; failed loads are
// reported here with their element.
window.__site.failed.forEach(function (e) { problems.push(e + ' did not load'); });
Array.prototype.forEach.call(document.images, function (img) {
  if (!(img.complete && img.naturalWidth > 0) && window.__site.failed.indexOf('<img> ' + img.src) < 0)
    problems.push('the image ' + img.getAttribute('src') + ' did not load (' + describe(img) + ')');
});
var links = [];
document.querySelectorAll('a[href]').forEach(function (a) {
  links.push([a.getAttribute('href'), a.href, describe(a) + ' "' + a.textContent.trim().slice(0, 40) + '"']);
});
var anchors = [];
document.querySelectorAll('[id]').forEach(function (e) { anchors.push(e.id); });
document.querySelectorAll('a[name]').forEach(function (e) { anchors.push(e.getAttribute('name')); });
return {problems: problems, links: links, anchors: anchors,
        text: Array.prototype.map.call(document.querySelectorAll('.fragment, pre'), function (f) {
          return f.textContent; }).join('\n')};
"""

# Full page height: Doxygen's tree view scrolls the page inside #doc-content.
PAGE_HEIGHT = r"""
var dc = document.getElementById('doc-content');
var h = document.documentElement.scrollHeight;
if (dc) h = Math.max(h, dc.scrollHeight + dc.getBoundingClientRect().top +
                        (document.getElementById('nav-path') ? 40 : 0));
return Math.ceil(h);
"""


def fail(message):
    print(f"check_site: {message}", file=sys.stderr)
    sys.exit(1)


def start_browser(profile):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        fail("python3-selenium is not installed (./workbook setup installs it)")
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            fail(f"{path} is missing: install Debian's {package} (./workbook setup installs it)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        # The pages are the site's own files: the sandbox protects nothing here, and it
        # cannot start as root or in most containers.
        "--no-sandbox",
        "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", "--disable-default-apps", "--hide-scrollbars",
        "--allow-file-access-from-files", "--force-device-scale-factor=1",
        f"--window-size={WIDTH},900", f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    except Exception as e:  # selenium's own exceptions carry a long stack trace of the driver
        fail(f"could not start headless chromium: {str(e).splitlines()[0]}")
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORDER})
    return driver


def console_problems(driver, seen_failures):
    out = []
    for entry in driver.get_log("browser"):
        if entry.get("level") != "SEVERE":
            continue
        message = entry.get("message", "")
        if "Failed to load resource" in message and any(u in message for u in seen_failures):
            continue  # already reported with its element
        out.append(f"console error: {message}")
    return out


def screenshot(driver, path):
    # MathJax's "Typesetting math: 100%" box lingers, and comes back while it loads its menu
    driver.execute_script("var s = document.createElement('style');"
                          "s.textContent = '#MathJax_Message { display: none !important; }';"
                          "document.head.appendChild(s);")
    height = min(int(driver.execute_script(PAGE_HEIGHT)), MAX_SCREENSHOT_HEIGHT)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False})
    time.sleep(0.3)  # Doxygen's resize handler lays the page out again
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path.write_bytes(base64.b64decode(shot["data"]))


def normalise(text):
    return " ".join(text.split())


def output_problems(page_text, output_file):
    """The captured output must be on the lesson page: its first, middle and last lines."""
    if not output_file.is_file():
        return [f"its captured output {output_file} does not exist"]
    lines = [normalise(l) for l in output_file.read_text(errors="replace").splitlines() if l.strip()]
    if not lines:
        return [f"its captured output {output_file} is empty"]
    text = normalise(page_text)
    samples = {lines[0], lines[len(lines) // 2], lines[-1]}
    missing = [s for s in samples if s not in text]
    if missing:
        return [f"the page does not show its program's output ({output_file.name}); "
                f"missing, for example: {missing[0][:80]!r}"]
    return []


BLANK_CANVASES = r"""
  var out = [];
  document.querySelectorAll('#attention-inspector canvas').forEach(function (c, i) {
    var d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, lit = 0;
    for (var k = 0; k < d.length; k += 4) if (d[k] < 200) ++lit;  // a shaded cell
    if (c.width === 0 || lit === 0) out.push(i);
  });
  return out;"""


def check_encoder_decoder_inspector(driver, data):
    """Lesson 17's inspector: a button per attention (encoder, decoder, cross); for each, one map
    per layer and head, the queries' and keys' characters, and the chosen query's weights over
    the keys as the data holds them (none past the diagonal of the decoder's causal map)."""
    from selenium.webdriver.common.by import By

    problems = []
    texts = {"source": data["source"], "written": data["written"], "decoder_input": data["decoder_input"]}
    root = "#attention-inspector"
    buttons = driver.find_elements(By.CSS_SELECTOR, f"{root} .ai-kind")
    names = [a["name"] for a in data["attentions"]]
    if [b.text for b in buttons] != names:
        return [f"the inspector's attention buttons read {[b.text for b in buttons]}; the data has {names}"]
    for k, a in enumerate(data["attentions"]):
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", buttons[k])
        buttons[k].click()
        L, NH = len(a["weights"]), len(a["weights"][0])
        rows, cols = texts[a["rows"]], texts[a["cols"]]
        where = a["name"]
        if driver.execute_script(f"return +document.querySelector('{root}').dataset.kind") != k:
            problems.append(f"clicking '{where}' does not choose it")
            continue
        cells = driver.find_elements(By.CSS_SELECTOR, f"{root} .ai-cell")
        if len(cells) != L * NH:
            problems.append(f"{where}: {len(cells)} maps drawn for {L} layers x {NH} heads")
            continue
        blank = driver.execute_script(BLANK_CANVASES)
        if blank:
            problems.append(f"{where}: maps {blank} are blank")
        chars = driver.find_elements(By.CSS_SELECTOR, f"{root} .ai-char")
        if len(chars) != len(rows) + len(cols):
            problems.append(f"{where}: {len(chars)} characters shown for {len(rows)} queries and {len(cols)} keys")
            continue
        # The last head of the last layer, then the last query, by clicking its character.
        cells[-1].click()
        q = len(rows) - 1
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", chars[q])
        chars[q].click()
        state = driver.execute_script(
            f"var r = document.querySelector('{root}');"
            "return [+r.dataset.layer, +r.dataset.head, +r.dataset.query];")
        if state != [L - 1, NH - 1, q]:
            problems.append(f"{where}: after clicking layer {L} head {NH} and query {q} the inspector "
                            f"shows layer {state[0] + 1} head {state[1] + 1} query {state[2]}")
            continue
        shown = [c.get_attribute("data-weight") for c in chars[len(rows):]]
        row = a["weights"][L - 1][NH - 1][q]
        expected = [f"{row[j]:.4f}" if j < len(row) else "" for j in range(len(cols))]
        if shown != expected:
            problems.append(f"{where}: query {q} of layer {L} head {NH} shades its keys {shown}; "
                            f"the data says {expected}")
        # The decoder's causal map: query 0 sees only itself.
        if a["rows"] == a["cols"] == "decoder_input":
            chars[0].click()
            first = [c.get_attribute("data-weight") for c in chars[len(rows):]]
            if first[1:] != [""] * (len(cols) - 1):
                problems.append(f"{where}: query 0 shows weights on later positions {first}")
    return problems


def check_inspector(driver):
    """The inspector draws one map per layer and head and answers a change of head and query."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    problems = []
    data = driver.execute_script("return window.ATTN_INSPECTOR_DATA || null")
    if not data:
        return ["the inspector's data (attention_data.js) did not load"]
    if data.get("kind") == "encoder_decoder":
        return check_encoder_decoder_inspector(driver, data)
    L, NH, T = data["n_layer"], data["n_head"], len(data["prompt"])
    cells = driver.find_elements(By.CSS_SELECTOR, "#attention-inspector .ai-cell")
    if len(cells) != L * NH:
        return [f"the inspector draws {len(cells)} maps; the model has {L} layers x {NH} heads = {L * NH}"]
    blank = driver.execute_script(BLANK_CANVASES)
    if blank:
        problems.append(f"the inspector's maps {blank} are blank")

    def shown():
        state = driver.execute_script(
            "var r = document.getElementById('attention-inspector');"
            "return [+r.dataset.layer, +r.dataset.head, +r.dataset.query,"
            " Array.prototype.map.call(r.querySelectorAll('.ai-char'), function (c) { return c.dataset.weight; })];")
        return state[0], state[1], state[2], state[3]

    def expected(l, h, q):
        row = data["weights"][l][h][q]
        return [f"{row[j]:.4f}" if j < len(row) else "" for j in range(T)]

    chars = driver.find_elements(By.CSS_SELECTOR, "#attention-inspector .ai-char")
    if len(chars) != T:
        return problems + [f"the inspector shows {len(chars)} prompt characters; the prompt has {T}"]
    # Choose the last head of the last layer, then a query by clicking its character.
    cells[-1].click()
    q = T // 2
    chars[q].click()
    l, h, query, weights = shown()
    if (l, h, query) != (L - 1, NH - 1, q):
        problems.append(f"after clicking layer {L} head {NH} and character {q} the inspector shows "
                        f"layer {l + 1} head {h + 1} query {query}")
    elif weights != expected(L - 1, NH - 1, q):
        problems.append(f"the highlighted weights of query {q} are {weights[:q + 1]}, the data says "
                        f"{expected(L - 1, NH - 1, q)[:q + 1]}")
    before = weights
    # Another head: what is highlighted must change, to that head's weights.
    cells[0].click()
    l, h, query, weights = shown()
    if (l, h) != (0, 0) or weights != expected(0, 0, q):
        problems.append(f"choosing layer 1 head 1 highlights {weights[:q + 1]}, the data says "
                        f"{expected(0, 0, q)[:q + 1]}")
    elif weights == before and data["weights"][0][0][q] != data["weights"][L - 1][NH - 1][q]:
        problems.append("choosing another head does not change what is highlighted")
    # Another query, by hovering over its character.
    q2 = T - 1 if q != T - 1 else 0
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", chars[q2])
    ActionChains(driver).move_to_element(chars[q2]).perform()
    l, h, query, weights = shown()
    if query != q2 or weights != expected(0, 0, q2):
        problems.append(f"hovering over character {q2} shows query {query} with weights {weights[:q2 + 1]}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, required=True, help="the build folder (to build docs)")
    parser.add_argument("--site", type=Path, required=True, help="the site's html folder")
    parser.add_argument("--outputs", type=Path, required=True, help="the lessons' captured output")
    parser.add_argument("--screenshots", type=Path, required=True, help="where screenshots go")
    parser.add_argument("--no-build", action="store_true", help="check the site as it is")
    args = parser.parse_args()
    started = time.monotonic()

    if not args.no_build:
        build = subprocess.run(["cmake", "--build", str(args.build), "--target", "docs"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if build.returncode != 0:
            print(build.stdout[-4000:])
            fail("the docs target did not build (above)")
    site = args.site.resolve()
    if not (site / "index.html").is_file():
        fail(f"no site at {site} (./workbook docs builds it)")
    pages = sorted(p for p in site.rglob("*.html") if "mathjax" not in p.relative_to(site).parts)
    source = Path(__file__).resolve().parents[2]
    lessons = sorted(d.name[:2] for d in (source / "lessons").glob("[0-9][0-9]_*") if d.is_dir())
    args.screenshots.mkdir(parents=True, exist_ok=True)
    for old in args.screenshots.glob("*.png"):
        old.unlink()

    problems = {}   # page -> list of problems
    anchors = {}    # page -> its ids and names
    links = {}      # page -> [(href, resolved, element)]
    inspector_pages = 0
    kinds = set()   # the models the inspectors show: "gpt", "encoder_decoder"
    with tempfile.TemporaryDirectory(prefix="check_site_") as profile:
        driver = start_browser(profile)
        try:
            for page in pages:
                rel = page.relative_to(site).as_posix()
                driver.get(page.as_uri())
                waited = driver.execute_async_script(WAIT_FOR_MATHJAX)
                found = driver.execute_script(INSPECT_PAGE)
                page_problems = list(found["problems"])
                if waited not in ("typeset", "none"):
                    page_problems.append(waited)
                failed_urls = [p.split("> ", 1)[1].split(" did not")[0] for p in page_problems
                               if p.startswith("<")]
                page_problems += console_problems(driver, failed_urls)
                anchors[rel] = set(found["anchors"])
                links[rel] = found["links"]
                m = re.fullmatch(r"lesson(\d\d)\.html", rel)
                if m:
                    page_problems += output_problems(found["text"], args.outputs / f"lesson{m.group(1)}.txt")
                if m or rel.startswith("attention_inspector"):  # as it opens, before any click
                    screenshot(driver, args.screenshots / page.with_suffix(".png").name)
                if driver.execute_script("return !!document.getElementById('attention-inspector')"):
                    inspector_pages += 1
                    kinds.add(driver.execute_script("return (window.ATTN_INSPECTOR_DATA || {}).kind || 'gpt'"))
                    page_problems += check_inspector(driver)
                    page_problems += console_problems(driver, [])
                if page_problems:
                    problems[rel] = page_problems
        finally:
            driver.quit()

    # Links inside the site must reach a file, and an anchor on that page when they name one.
    for rel, page_links in links.items():
        for href, resolved, element in page_links:
            url = urllib.parse.urlsplit(resolved)
            if url.scheme in ("http", "https", "mailto", "javascript", "data", "about"):
                continue
            if url.scheme != "file":
                problems.setdefault(rel, []).append(f"the link {href!r} ({element}) has scheme {url.scheme}")
                continue
            target = Path(urllib.parse.unquote(url.path))
            try:
                target_rel = target.resolve().relative_to(site).as_posix()
            except ValueError:
                problems.setdefault(rel, []).append(f"the link {href!r} ({element}) leaves the site: {target}")
                continue
            if not target.exists():
                problems.setdefault(rel, []).append(f"the link {href!r} ({element}) points to a missing file")
            elif url.fragment and target.suffix == ".html":
                fragment = urllib.parse.unquote(url.fragment)
                if target_rel in anchors and fragment not in anchors[target_rel]:
                    problems.setdefault(rel, []).append(
                        f"the link {href!r} ({element}) points to no anchor: {target_rel} has no #{fragment}")

    for nn in lessons:
        if f"lesson{nn}.html" not in anchors:
            problems.setdefault(f"lesson{nn}.html", []).append(f"lesson {nn} has no page in the site")
    if "gpt" not in kinds:
        problems.setdefault("attention_inspector.html", []).append("the site has no attention inspector")
    if "encoder_decoder" not in kinds:
        problems.setdefault("attention_inspector_encoder_decoder.html", []).append(
            "the site has no inspector of lesson 17's encoder-decoder")

    count = sum(len(v) for v in problems.values())
    for rel in sorted(problems):
        for p in problems[rel]:
            print(f"FAIL {rel}: {p}")
    print(f"{len(pages)} pages ({len(lessons)} lessons, {inspector_pages} inspectors) checked in "
          f"{time.monotonic() - started:.0f} s; screenshots in {args.screenshots}")
    if count:
        print(f"{count} problems on {len(problems)} pages")
        return 1
    print("no MathJax errors, broken images, dead links, script errors or missing output")
    return 0


if __name__ == "__main__":
    sys.exit(main())
