"""The documentation site in a real browser (issue 49): headless Chromium at 1280 x 900 px loads the built
site from a local server and measures the layout of each page of docs/, which a probe script added to the
page's HTML writes into the DOM (read back with --dump-dom): the content column is wide, no code block and no
page scrolls sideways, every table fits its box (the results pages' 11-column ones too), and the home page's
KL figure is shown as panels a reader can read. Marked slow; skipped without Chromium (Debian: apt-get
install chromium).

With DOCS_SCREENSHOTS=<folder> it also writes the screenshots of results/benchmarks/docs_screenshots/
(README.md there): each page's first 1280 x 900 px, and the home figure and the first MuJoCo table in
1280 x 900 px views cut from a taller window."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None
)
WIDTH, HEIGHT = 1280, 900
# every page of docs/, as its site path ("" the home page)
PAGES = sorted(
    os.path.relpath(os.path.join(d, f[: -len(".md")]), os.path.join(ROOT, "docs")).replace(os.sep, "/") + "/"
    for d, _, fs in os.walk(os.path.join(ROOT, "docs"))
    for f in fs
    if f.endswith(".md")
)
PAGES = ["" if p == "index/" else p for p in PAGES]
# the pages the review looked at and their screenshots: site path -> name
SHOTS = {
    "": "home",
    "quickstart/": "quickstart",
    "trainers/rgpo/": "trainers_rgpo",
    "results/mujoco/": "results_mujoco",
}
# views further down a page: (site path, CSS selector of the element at the view's top, screenshot name)
VIEWS = [("", "figure.panels", "home_figure"), ("results/mujoco/", ".table-wide", "results_mujoco_table")]

PROBE = """<script>
window.addEventListener("load", function () {
  function box(e) { return e.getBoundingClientRect(); }
  var content = document.querySelector(".md-content");
  var r = {
    viewport: window.innerWidth,
    page_scroll_width: document.documentElement.scrollWidth,
    content_width: content ? box(content).width : 0,
    code_overflow: Array.from(document.querySelectorAll("pre > code")).map(function (e) {
      return e.scrollWidth - e.clientWidth; }),
    tables: Array.from(document.querySelectorAll(".table-wrap")).map(function (e) {
      return {columns: +e.dataset.columns, overflow: box(e.querySelector("table")).width - box(e).width}; }),
    panels: Array.from(document.querySelectorAll("figure.panels .panel")).map(function (e) {
      return box(e).width; }),
    tops: {}
  };
  %s.forEach(function (s) {
    var e = document.querySelector(s);
    if (e) r.tops[s] = box(e).top + window.scrollY; });
  var out = document.createElement("pre");
  out.id = "layout-probe";
  out.textContent = JSON.stringify(r);
  document.body.appendChild(out);
});
</script>"""


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no request lines on stderr
        pass


def chromium(*args: str, window: tuple[int, int] = (WIDTH, HEIGHT)) -> str:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={window[0]},{window[1]}",
            *args,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The built site (mkdocs build --strict), the probe added to each checked page, served on localhost."""
    if CHROMIUM is None:
        pytest.skip("no Chromium (apt-get install chromium)")
    site = str(tmp_path_factory.mktemp("site"))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    selectors = json.dumps([s for _, s, _ in VIEWS])
    for path in PAGES:
        html_path = os.path.join(site, path, "index.html")
        with open(html_path, encoding="utf-8") as fh:
            html = fh.read()
        with open(html_path, "w", encoding="utf-8") as fh:
            fh.write(html.replace("</body>", PROBE % selectors + "</body>"))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=site))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def layout(server) -> dict[str, dict]:
    measured = {}
    for path in PAGES:
        dom = chromium("--virtual-time-budget=5000", "--dump-dom", server + path)
        m = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
        assert m, f"{path or 'home'}: the probe wrote nothing"
        measured[path] = json.loads(m[1].replace("&quot;", '"').replace("&amp;", "&"))
    return measured


@pytest.mark.parametrize("path", list(PAGES))
def test_wide_column_and_no_sideways_scroll(layout, path):
    r = layout[path]
    assert r["viewport"] == WIDTH
    assert r["content_width"] >= 900, f"content column {r['content_width']:.0f} px at {WIDTH} px"
    assert r["page_scroll_width"] <= WIDTH, "the page scrolls sideways"
    assert all(o <= 1 for o in r["code_overflow"]), f"code blocks scroll sideways: {r['code_overflow']}"


def test_tables_fit(layout):
    assert any(t["columns"] == 11 for t in layout["results/mujoco/"]["tables"])
    wide = [f"{p or 'home'}: {t}" for p, r in layout.items() for t in r["tables"] if t["overflow"] > 1]
    assert not wide, f"tables wider than their box at {WIDTH} px: {wide}"


def test_home_figure_panels_readable(layout):
    panels = layout[""]["panels"]
    # each panel of the 1680 px figure is about 420 px: shown at 400 px or more, its labels are at full size
    assert len(panels) == 4 and min(panels) >= 400, panels


def test_screenshots(server, layout):
    out = os.environ.get("DOCS_SCREENSHOTS")
    if not out:
        pytest.skip("DOCS_SCREENSHOTS=<folder> writes the screenshots")
    from PIL import Image

    os.makedirs(out, exist_ok=True)

    def save(png: str, name: str, top: int = 0) -> None:
        with Image.open(png) as im:
            view = im.crop((0, top, WIDTH, top + HEIGHT)).convert("RGB")
        view.quantize(colors=256).save(os.path.join(out, f"{name}.png"), optimize=True)

    with tempfile.TemporaryDirectory() as tmp:
        for path, name in SHOTS.items():
            png = os.path.join(tmp, f"{name}.png")
            chromium("--virtual-time-budget=5000", f"--screenshot={png}", server + path)
            save(png, name)
        for path, selector, name in VIEWS:
            top = max(0, int(layout[path]["tops"][selector]) - 120)
            png = os.path.join(tmp, f"{name}.png")
            chromium(
                "--virtual-time-budget=5000",
                f"--screenshot={png}",
                server + path,
                window=(WIDTH, top + HEIGHT),
            )
            save(png, name, top)
