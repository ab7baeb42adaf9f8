"""MkDocs hook: publish the committed results and benchmark outputs with the site, so the pages link to the
exact files a command wrote (tables, figures, JSON) and `mkdocs build --strict` fails when one is missing; and
make the pages read well in a browser (issue 49): the paper's equation labels as numbers and names, tables in
scroll boxes (wide ones compact), figures linked to their full-size file (a row of panels shown as a grid),
and a contents list at the top of a long page. The Markdown sources are left as GitHub shows them."""

from __future__ import annotations

import glob
import logging
import os
import posixpath
import re

from mkdocs.structure.files import File

# repository files that pages link to, relative to the repository root
PUBLISHED = [
    "results/benchmarks/**/*",
    "results/mujoco/report/**/*",
    "results/mujoco/policy_lag_confirm/RULES.md",
    "results/mujoco/policy_lag_confirm/report/**/*",
    "results/mujoco/normalisation/*",
    "results/rlhf/report/**/*",
    "results/rlhf/*/report/**/*",
    "results/rlhf/v3/*/report/**/*",
    "results/rlhf/v3/mismatch/*.md",
    "results/rlhf/tune/selection.*",
    "results/rlhf/v3/tune/selection.*",
]


def on_files(files, config):
    root = os.path.dirname(config["docs_dir"])
    for pattern in PUBLISHED:
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            if os.path.isfile(path):
                rel = os.path.relpath(path, root)
                site = {"dest_dir": config["site_dir"], "use_directory_urls": config["use_directory_urls"]}
                files.append(File(rel, src_dir=root, **site))
    return files


# --- reading in a browser (issue 49): equation labels, tables, figures, a contents list --------------------

log = logging.getLogger("mkdocs.plugins.docs_hooks")

# The paper's equation labels (\label{eq:...} in rgpo_paper.tex) with the number LaTeX gives each (article
# class: one counter for the whole paper, appendix included) and a name a reader can place. The pages cite
# "Eq. beta_update", which GitHub shows as written; the site shows "Eq. (26) (adaptive β)".
# tests/test_docs_hooks.py numbers the .tex's equations again and checks this table against it.
EQUATIONS: dict[str, tuple[int, str]] = {
    "trpo": (3, "TRPO surrogate"),
    "rgpo": (7, "RGPO objective"),
    "nabla_r": (10, "gradient of the ratio"),
    "gradient": (11, "RGPO gradient"),
    "sigmoid": (14, "sigmoid gate"),
    "clipped_linear": (16, "clipped-linear gate"),
    "temperature_controlled": (17, "temperature-controlled gate"),
    "rgpo_rlhf": (18, "dual-gate RLHF objective"),
    "var_rgpo": (22, "RGPO variance bound"),
    "practical": (24, "practical objective"),
    "kl_estimator": (25, "KL estimator"),
    "beta_update": (26, "adaptive β"),
    "varX_exact": (33, "exact IS variance"),
}
# "Eq. beta_update": a label cited after "Eq." (in a page's HTML: its prose, code comments and the docstrings
# mkdocstrings renders); a word with an underscore that is no label fails the build
EQ_CITE = re.compile(r"\bEq\.(\s+)([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*)\b")

# one-row multi-panel figures shown as a grid of their panels: repository path -> (panels, panels per row)
PANELLED = {"results/mujoco/report/curves_kl.png": (4, 2)}
# tables with this many columns or more get the compact style (extra.css: .table-wide)
WIDE_TABLE_COLUMNS = 8
# pages of this many words or more get a contents list under their title
TOC_MIN_WORDS = 2000

TABLE = re.compile(r"<table\b[^>]*>.*?</table>", re.S)
FIRST_ROW = re.compile(r"<tr\b[^>]*>(.*?)</tr>", re.S)
CELL = re.compile(r"<t[hd][\s>]")
FIGURE = re.compile(r"<p>\s*(<img\b[^>]*>)\s*</p>")
ATTR = re.compile(r'(\w+)="([^"]*)"')


def resolve_equations(text: str, where: str = "") -> str:
    """Each "Eq. <label>" of the paper as "Eq. (<number>) (<name>)"; a cited label with an underscore that
    the table does not know is logged as a warning (a failure under --strict)."""

    def sub(m: re.Match) -> str:
        label = m[2]
        if label in EQUATIONS:
            number, name = EQUATIONS[label]
            return f"Eq.{m[1]}({number}) ({name})"
        if "_" in label:
            log.warning(f"{where}: 'Eq. {label}' is no equation label of the paper (docs_hooks.EQUATIONS)")
        return m[0]

    return EQ_CITE.sub(sub, text)


def wrap_tables(html: str) -> str:
    """Every table in a div.table-wrap (it scrolls inside its own box), with .table-wide from
    WIDE_TABLE_COLUMNS columns on."""

    def sub(m: re.Match) -> str:
        row = FIRST_ROW.search(m[0])
        columns = len(CELL.findall(row[1])) if row else 0
        cls = "table-wrap table-wide" if columns >= WIDE_TABLE_COLUMNS else "table-wrap"
        return f'<div class="{cls}" data-columns="{columns}">{m[0]}</div>'

    return TABLE.sub(sub, html)


def panel_bounds(path: str, panels: int) -> list[tuple[int, int]] | None:
    """The [x0, x1) pixel columns of each panel of a one-row figure, cut in the middle of the white gutters
    between them (columns with no pixel darker than 250/255); None when the gutters do not give `panels`
    panels (a figure of another layout is then shown whole), or without Pillow."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        return None
    with Image.open(path) as im:
        gray = im.convert("L")
        width, height = gray.size
        white = [gray.crop((x, 0, x + 1, height)).getextrema()[0] >= 250 for x in range(width)]
    runs, start = [], None
    for x, w in enumerate([*white, False]):
        if w and start is None:
            start = x
        elif not w and start is not None:
            runs.append((start, x))
            start = None
    # inner gutters: the widest white runs that touch neither edge
    inner = sorted((r for r in runs if r[0] > 0 and r[1] < width), key=lambda r: r[0] - r[1])[: panels - 1]
    if len(inner) != panels - 1:
        return None
    cuts = [0, *sorted((a + b) // 2 for a, b in inner), width]
    bounds = list(zip(cuts[:-1], cuts[1:], strict=True))
    widths = [b - a for a, b in bounds]
    if min(widths) < 0.5 * max(widths):  # not a row of like panels
        return None
    return bounds


def panel_figure(img: str, path: str, panels: int, per_row: int) -> str | None:
    """The HTML of a figure.panels showing the image `img` (an <img> tag) as its panels, `per_row` to a
    row, each a div.panel cropping the one image; None when panel_bounds finds no such panels."""
    from PIL import Image

    bounds = panel_bounds(path, panels)
    if bounds is None:
        return None
    with Image.open(path) as im:
        width, height = im.size
    attrs = dict(ATTR.findall(img))
    src, alt = attrs.get("src", ""), attrs.get("alt", "")
    cells = []
    for i, (x0, x1) in enumerate(bounds):
        w = x1 - x0
        style = f"width:{100 * width / w:.4f}%;left:{-100 * x0 / w:.4f}%"
        cells.append(
            f'<div class="panel" style="flex:{w} 1 0;aspect-ratio:{w}/{height}">'
            f'<img src="{src}" alt="{alt} (panel {i + 1} of {panels})" style="{style}" loading="lazy"></div>'
        )
    # a row's panels share its width in proportion to their pixels, so a row shows them at one scale
    rows = "".join(
        f'<div class="panel-row">{"".join(cells[i : i + per_row])}</div>' for i in range(0, panels, per_row)
    )
    return (
        f'<figure class="panels"><a class="panel-grid" href="{src}" title="the full-size figure">{rows}</a>'
        f"<figcaption>The figure's {panels} panels, {per_row} to a row; "
        f'<a href="{src}">the full-size figure</a> ({width} × {height} px).</figcaption></figure>'
    )


def figures(html: str, page, files) -> str:
    """An image alone in its paragraph becomes a link to its full-size file; one listed in PANELLED is shown
    as its panels (panel_figure)."""
    base = posixpath.dirname(page.file.url) if not page.file.url.endswith("/") else page.file.url

    def sub(m: re.Match) -> str:
        img = m[1]
        src = dict(ATTR.findall(img)).get("src", "")
        url = posixpath.normpath(posixpath.join(base, src))
        published = next((f for f in files if f.url == url), None)
        if published is not None and published.src_uri in PANELLED:
            figure = panel_figure(img, published.abs_src_path, *PANELLED[published.src_uri])
            if figure is not None:
                return figure
            log.info(f"{page.file.src_uri}: {published.src_uri} is not a row of panels; shown whole")
        return f'<p><a class="figure-link" href="{src}" title="the full-size image">{img}</a></p>'

    return FIGURE.sub(sub, html)


def toc_list(items) -> str:
    entries = [
        f'<li><a href="{item.url}">{item.title}</a>{toc_list(item.children) if item.children else ""}</li>'
        for item in items
    ]
    return f"<ul>{''.join(entries)}</ul>"


def count(items) -> int:
    return sum(1 + count(item.children) for item in items)


def page_toc(html: str, page) -> str:
    """A contents list (nav.page-toc) under the title of a page of TOC_MIN_WORDS words or more with three
    headings or more under its title; the sidebar has the same list, this one is where a reader starts."""
    items = list(page.toc)
    if len(items) == 1 and items[0].level == 1:
        items = list(items[0].children)
    words = len(re.sub(r"<[^>]+>", " ", html).split())
    if words < TOC_MIN_WORDS or count(items) < 3:
        return html
    nav = f'<nav class="page-toc" aria-label="Contents"><p>Contents</p>{toc_list(items)}</nav>'
    head = re.search(r"</h1>", html)
    at = head.end() if head else 0
    return html[:at] + nav + html[at:]


def on_page_content(html, page, config, files):
    # on the HTML, so the labels that mkdocstrings brings in from docstrings (the API reference) resolve too
    html = resolve_equations(html, page.file.src_uri)
    return page_toc(figures(wrap_tables(html), page, files), page)
