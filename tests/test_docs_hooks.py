"""docs_hooks.py's reading aids (issue 49), without a browser: the paper's equation labels resolve to the
numbers LaTeX gives them (checked against the paper's .tex where this checkout has it), wide tables are
marked, the home page's four-panel figure is cut at its gutters, and long pages get a contents list.
tests/test_docs_render.py checks the same in the built site; tests/test_docs_browser.py in Chromium."""

from __future__ import annotations

import logging
import os
import re
import sys
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import docs_hooks  # noqa: E402

# the paper this project reproduces (not tracked): named by RGPO_PAPER_TEX, or paper/rgpo_paper.tex in the
# checkout (DESIGN.md's place for it), or the development machines' copy beside the checkout
PAPER_IN_CHECKOUT = os.path.join(ROOT, "paper", "rgpo_paper.tex")
PAPER_BESIDE = os.path.join(os.path.dirname(ROOT), "shared", "paper", "rgpo_paper.tex")
PAPER = os.environ.get("RGPO_PAPER_TEX") or next(
    (path for path in (PAPER_IN_CHECKOUT, PAPER_BESIDE) if os.path.isfile(path)), PAPER_IN_CHECKOUT
)
NO_PAPER = (
    f"RGPO_PAPER_TEX={PAPER} is not a file"
    if os.environ.get("RGPO_PAPER_TEX")
    else "the paper's .tex is not in this checkout: copy it to paper/rgpo_paper.tex here, or set "
    "RGPO_PAPER_TEX=<path to rgpo_paper.tex>"
)
PAGES = sorted(
    os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "docs")) for f in fs if f.endswith(".md")
) + [os.path.join(ROOT, "README.md")]

# LaTeX's equation counter: each numbered display (equation, multline: one number; align, gather, eqnarray,
# flalign, alignat: one a row) not marked \nonumber / \notag; starred ones and \[...\] are not numbered
ENV = re.compile(
    r"\\begin\{(equation|multline|align|gather|eqnarray|flalign|alignat)(\*?)\}(.*?)\\end\{\1\2\}", re.S
)
NESTED = re.compile(r"\\begin\{(\w+\*?)\}.*?\\end\{\1\}", re.S)
ROW_END = re.compile(r"\\\\(?:\[[^\]]*\])?")


def equation_numbers(tex: str) -> dict[str, int]:
    """{label: number} of the \\label{eq:...} of a LaTeX document of the article class (one counter, no
    \\numberwithin): the number its display (or its row of an align) gets."""
    assert "\\numberwithin" not in tex and "\\tag" not in tex, "numbering this counter does not model"
    tex = "\n".join(re.sub(r"(?<!\\)%.*", "", line) for line in tex.splitlines())
    number, labels = 0, {}
    for m in ENV.finditer(tex):
        env, star, body = m[1], m[2], m[3]
        if star:
            continue
        if env in ("equation", "multline"):
            rows = [body]
        else:  # rows end at a \\ outside a nested environment (cases, aligned, ...): drop those first
            while NESTED.search(body):
                body = NESTED.sub("", body)
            rows = [r for r in ROW_END.split(body) if r.strip()]
        for row in rows:
            if re.search(r"\\(nonumber|notag)\b", row):
                continue
            number += 1
            for label in re.findall(r"\\label\{eq:([^}]*)\}", row):
                labels[label] = number
    return labels


def test_equation_numbers_model_latex():
    tex = r"""
    \begin{equation} a \label{eq:one} \end{equation}
    \begin{equation*} b \end{equation*}
    % \begin{equation} commented out \label{eq:never} \end{equation}
    \begin{align} c &= d \notag \\ &= e \label{eq:three} \\ &= f \end{align}
    \begin{equation} g = \begin{cases} 1 \\[4pt] 2 \end{cases} \label{eq:five} \end{equation}
    \begin{align} h &= \begin{cases} 1 \\ 2 \end{cases} \label{eq:six} \end{align}
    """
    assert equation_numbers(tex) == {"one": 1, "three": 2, "five": 4, "six": 5}


@pytest.mark.skipif(not os.path.isfile(PAPER), reason=NO_PAPER)
def test_equation_table_matches_the_paper():
    with open(PAPER, encoding="utf-8") as fh:
        numbers = equation_numbers(fh.read())
    assert numbers, "no \\label{eq:...} found in the paper"
    table = {label: number for label, (number, _) in docs_hooks.EQUATIONS.items()}
    assert table == numbers, "docs_hooks.EQUATIONS differs from the paper's equation numbers"


def test_pages_cite_only_known_labels():
    unknown = []
    for path in PAGES:
        with open(path, encoding="utf-8") as fh:
            for m in docs_hooks.EQ_CITE.finditer(fh.read()):
                if "_" in m[2] and m[2] not in docs_hooks.EQUATIONS:
                    unknown.append(f"{os.path.relpath(path, ROOT)}: Eq. {m[2]}")
    assert not unknown, "labels the paper does not have: " + ", ".join(unknown)


def test_resolve_equations(caplog):
    text = "towards a target KL (paper Eq. beta_update); the dual gate of Eq. rgpo_rlhf. Eq. and so on."
    assert docs_hooks.resolve_equations(text) == (
        "towards a target KL (paper Eq. (26) (adaptive β)); the dual gate of Eq. (18) (dual-gate RLHF "
        "objective). Eq. and so on."
    )
    with caplog.at_level(logging.WARNING, logger="mkdocs.plugins.docs_hooks"):
        assert docs_hooks.resolve_equations("Eq. beta_updat", "x.md") == "Eq. beta_updat"
    assert "Eq. beta_updat" in caplog.text and "x.md" in caplog.text


def test_wrap_tables():
    row = "<tr>" + "<th>h</th>" * 11 + "</tr>"
    html = f"<p>x</p><table><thead>{row}</thead></table><table><tr><td>a</td><td>b</td></tr></table>"
    out = docs_hooks.wrap_tables(html)
    assert f'<div class="table-wrap table-wide" data-columns="11"><table><thead>{row}' in out
    assert '<div class="table-wrap" data-columns="2"><table><tr><td>a</td>' in out
    assert out.count("</table></div>") == 2


KL_FIGURE = os.path.join(ROOT, "results", "mujoco", "report", "curves_kl.png")


@pytest.mark.skipif(not os.path.isfile(KL_FIGURE), reason="no results/mujoco/report/curves_kl.png")
def test_kl_figure_cut_into_its_four_panels():
    pytest.importorskip("PIL")
    from PIL import Image

    bounds = docs_hooks.panel_bounds(KL_FIGURE, 4)
    with Image.open(KL_FIGURE) as im:
        width = im.size[0]
    assert bounds is not None and len(bounds) == 4
    assert bounds[0][0] == 0 and bounds[-1][1] == width
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    # a figure of another layout is not cut
    assert docs_hooks.panel_bounds(KL_FIGURE, 6) is None


def test_figures_link_and_panels(tmp_path):
    pytest.importorskip("PIL")
    from PIL import Image

    # a one-row figure of three 100 px panels with 20 px white gutters, and a plain image
    im = Image.new("L", (340, 50), 255)
    for x0 in (0, 120, 240):
        im.paste(0, (x0, 0, x0 + 100, 50))
    im.save(tmp_path / "row.png")
    files = [
        SimpleNamespace(url="fig/row.png", src_uri="fig/row.png", abs_src_path=str(tmp_path / "row.png")),
        SimpleNamespace(url="fig/one.png", src_uri="fig/one.png", abs_src_path=""),
    ]
    page = SimpleNamespace(file=SimpleNamespace(url="sub/page/", src_uri="sub/page.md"))
    html = '<p><img alt="Row" src="../../fig/row.png" /></p><p><img alt="One" src="../../fig/one.png" /></p>'
    old = dict(docs_hooks.PANELLED)
    docs_hooks.PANELLED["fig/row.png"] = (3, 2)
    try:
        out = docs_hooks.figures(html, page, files)
    finally:
        docs_hooks.PANELLED.clear()
        docs_hooks.PANELLED.update(old)
    assert out.count('class="panel"') == 3 and out.count('class="panel-row"') == 2
    assert 'alt="Row (panel 2 of 3)"' in out and "left:-91.6667%" in out  # panel 2: x 110-230
    assert '<a class="figure-link" href="../../fig/one.png" title="the full-size image"><img alt="One"' in out


def test_page_toc_on_long_pages_only():
    def item(title, anchor, level=2, children=()):
        return SimpleNamespace(title=title, url=f"#{anchor}", level=level, children=list(children))

    sections = [item("A", "a"), item("B", "b", children=[item("B1", "b1", 3)]), item("C", "c")]
    page = SimpleNamespace(toc=[item("Title", "title", 1, sections)])
    long = "<h1>Title</h1>" + "<p>" + "word " * docs_hooks.TOC_MIN_WORDS + "</p>"
    out = docs_hooks.page_toc(long, page)
    assert out.startswith('<h1>Title</h1><nav class="page-toc" aria-label="Contents"><p>Contents</p><ul>')
    assert '<li><a href="#b">B</a><ul><li><a href="#b1">B1</a></li></ul></li>' in out
    assert docs_hooks.page_toc("<h1>Title</h1><p>short</p>", page) == "<h1>Title</h1><p>short</p>"
