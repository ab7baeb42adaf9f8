"""The documentation site renders as written: one `mkdocs build --strict` per session, then the HTML of every
page of docs/ is parsed (html.parser) for the marks of Markdown that did not render: a list swallowed into a
table or a paragraph, a code fence shown as text or not rendered, bullets glued into one paragraph; and the
site holds no published source file. tests/test_docs.py runs the pages' code; this checks what a browser
shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

pytest.importorskip("mkdocs")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
PAGES = sorted(
    os.path.relpath(os.path.join(d, f), DOCS) for d, _, fs in os.walk(DOCS) for f in fs if f.endswith(".md")
)
# a line of three or more backticks (and an info string where it opens a block)
FENCE = re.compile(r"^[ \t]*(`{3,})(.*)$")
# a cell or paragraph that is a swallowed list item: "- " and text, not a "- / 0.079" placeholder cell
LIST_ITEM = re.compile(r"^- +(?![/|]|$)")
# a bullet glued into a paragraph: "- " and text opening a line of it after its first (Markdown starts a list
# only after a blank line, so such a line was meant as a list item)
GLUED = re.compile(r"\n[ \t]*- +(?![/|\s])")


class Page(HTMLParser):
    """The text of a page's table cells and paragraphs, its text outside code, and its <pre> count. In a
    block's text a rendered bold (<strong>, <b>) is marked "**" again, so a glued " - **Claim**" bullet reads
    as written."""

    BLOCKS = ("td", "th", "p")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, list[str]]] = []  # the td/th/p being read, innermost last
        self.blocks: list[tuple[str, str]] = []  # (tag, text) of each closed td/th/p
        self.code_depth = 0
        self.skip_depth = 0  # <script>/<style>: not text a reader sees
        self.prose: list[str] = []
        self.pres = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.BLOCKS:
            self.open.append((tag, []))
        elif tag in ("code", "pre"):
            self.code_depth += 1
            self.pres += tag == "pre"
        elif tag in ("script", "style"):
            self.skip_depth += 1
        elif tag in ("strong", "b"):
            for _, parts in self.open:
                parts.append("**")

    def handle_endtag(self, tag):
        if tag in self.BLOCKS:
            for i in range(len(self.open) - 1, -1, -1):
                if self.open[i][0] == tag:
                    self.blocks.append((tag, "".join(self.open[i][1])))
                    del self.open[i:]
                    break
        elif tag in ("code", "pre"):
            self.code_depth = max(0, self.code_depth - 1)
        elif tag in ("script", "style"):
            self.skip_depth = max(0, self.skip_depth - 1)

    def handle_data(self, data):
        if self.skip_depth:
            return
        for _, parts in self.open:
            parts.append(data)
        if not self.code_depth:
            self.prose.append(data)


def opening_fences(markdown: str) -> int:
    """The number of fenced code blocks in a Markdown page (an opening fence and its closing one count
    once)."""
    count, inside = 0, None
    for line in markdown.splitlines():
        m = FENCE.match(line)
        if not m:
            continue
        if inside is None:
            count, inside = count + 1, m[1]
        elif m[1].startswith(inside) and not m[2].strip():
            inside = None
    return count


def html_of(site: str, page: str) -> str:
    stem = page[: -len(".md")]
    if os.path.basename(stem) in ("index", "README"):
        rel = os.path.join(os.path.dirname(stem), "index.html")
    else:
        rel = os.path.join(stem, "index.html")
    return os.path.join(site, rel)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("site"))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", out]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-4000:]}"
    return out


def parse(path: str) -> Page:
    parser = Page()
    with open(path, encoding="utf-8") as fh:
        parser.feed(fh.read())
    parser.close()
    return parser


@pytest.fixture(scope="module")
def pages(site) -> dict[str, Page]:
    """The parsed HTML of each page of docs/ (the committed outputs that docs_hooks.py publishes beside them
    are written by their commands and not checked here)."""
    parsed = {}
    for page in PAGES:
        path = html_of(site, page)
        assert os.path.isfile(path), f"{page}: no {os.path.relpath(path, site)} in the site"
        parsed[page] = parse(path)
    return parsed


def test_no_list_swallowed_into_a_table_or_paragraph(pages):
    bad = [
        f"{name}: <{tag}> {text.strip()[:80]!r}"
        for name, page in pages.items()
        for tag, text in page.blocks
        if LIST_ITEM.match(text.lstrip())
    ]
    assert not bad, "a Markdown list rendered as a table cell or paragraph:\n" + "\n".join(bad)


def test_no_code_fence_shown_as_text(pages):
    bad = [name for name, page in pages.items() if "```" in "".join(page.prose)]
    assert not bad, "a literal ``` outside <code>/<pre> on: " + ", ".join(sorted(bad))


def test_no_bullets_glued_into_one_paragraph(pages):
    bad = [
        f"{name}: {text.strip()[:80]!r}"
        for name, page in pages.items()
        for tag, text in page.blocks
        if tag == "p" and (" ".join(text.split()).count(" - **") >= 2 or GLUED.search(text))
    ]
    assert not bad, "bullets rendered as one paragraph:\n" + "\n".join(bad)


def test_no_source_file_published(site):
    published = [
        os.path.relpath(os.path.join(d, f), site)
        for d, _, fs in os.walk(site)
        for f in fs
        if f.endswith(".py")
    ]
    assert not published, "source files published with the site: " + ", ".join(sorted(published))


@pytest.mark.parametrize("page", PAGES)
def test_every_code_fence_renders(pages, page):
    with open(os.path.join(DOCS, page), encoding="utf-8") as fh:
        fences = opening_fences(fh.read())
    assert pages[page].pres >= fences, (
        f"{page}: {fences} code fences in the source, {pages[page].pres} <pre> in the HTML"
    )


# --- reading aids (issue 49; docs_hooks.py, docs/stylesheets/extra.css, tests/test_docs_hooks.py) ----------


def raw_html(site: str, page: str) -> str:
    with open(html_of(site, page), encoding="utf-8") as fh:
        return fh.read()


def test_every_page_loads_the_extra_css(site):
    with open(os.path.join(site, "stylesheets", "extra.css"), encoding="utf-8") as fh:
        css = fh.read()
    for rule in (".md-grid", "white-space: pre-wrap", ".table-wrap", ".table-wide", "figure.panels"):
        assert rule in css, f"extra.css has no {rule}"
    missing = [
        p for p in PAGES if not re.search(r'<link[^>]+href="[^"]*stylesheets/extra\.css"', raw_html(site, p))
    ]
    assert not missing, "pages without extra.css: " + ", ".join(missing)


def test_equation_labels_resolved(site):
    sys.path.insert(0, ROOT)
    import docs_hooks

    labels = "|".join(map(re.escape, docs_hooks.EQUATIONS))
    raw = re.compile(rf"\bEq\.\s+({labels})\b")
    left = [f"{p}: {m[0]}" for p in PAGES for m in raw.finditer(raw_html(site, p))]
    assert not left, "equation labels shown as written: " + ", ".join(left)
    assert "(paper Eq. (26) (adaptive β))" in raw_html(site, "index.md")


def test_every_table_in_a_scroll_box(site):
    bare = []
    for page in PAGES:
        html = raw_html(site, page)
        tables = [m.start() for m in re.finditer(r"<table\b", html)]
        wrapped = [m.end() for m in re.finditer(r'<div class="table-wrap[^"]*" data-columns="\d+">', html)]
        bare += [f"{page} at {t}" for t in tables if t not in wrapped]
    assert not bare, "tables outside div.table-wrap: " + ", ".join(bare)
    assert '<div class="table-wrap table-wide" data-columns="11">' in raw_html(site, "results/mujoco.md")


def test_home_kl_figure_in_panels(site):
    html = raw_html(site, "index.md")
    figure = re.search(r'<figure class="panels">.*?</figure>', html, re.S)
    assert figure, "the home page's KL figure is not shown as its panels"
    assert figure[0].count('<div class="panel"') == 4
    assert 'href="results/mujoco/report/curves_kl.png"' in figure[0]


@pytest.mark.parametrize("page", ["results/mujoco.md", "results/rlhf.md"])
def test_results_pages_open_with_contents(site, page):
    html = raw_html(site, page)
    toc = re.search(r'<nav class="page-toc"[^>]*>.*?</nav>', html, re.S)
    assert toc and html.index("</h1>") < toc.start(), f"{page}: no contents list under its title"
    assert toc[0].count("<li>") >= 3
