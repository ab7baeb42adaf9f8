"""The README's relative links point at files that exist and at headings those files have.

mkdocs checks the links between docs pages (``validation.anchors`` in mkdocs.yml); the README is read on
GitHub, outside mkdocs, so its links are checked here, with GitHub's heading slugs.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub gives a page: heading slugs (repeats numbered -1, -2, ...) and explicit ids."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(re.findall(r'<a\s+id="([^"]+)"', line))
    return found


def test_slug_matches_github():
    # Examples of GitHub's rendering: backticks and punctuation go, underscores and hyphens stay.
    assert github_slug("The confirmation (`policy_lag_confirm`): running") == (
        "the-confirmation-policy_lag_confirm-running"
    )
    assert (
        github_slug("Annealed learning rate (CleanRL's defaults)")
        == "annealed-learning-rate-cleanrls-defaults"
    )
    assert github_slug("a - b") == "a---b"


def test_anchors_number_repeated_headings(tmp_path):
    page = tmp_path / "p.md"
    page.write_text('# Setup\n```\n# not a heading\n```\n## Setup\n<a id="kept"></a>\n', encoding="utf-8")
    assert anchors(page) == {"setup", "setup-1", "kept"}


def readme_links() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return sorted(
        {link for link in LINK.findall(text) if "://" not in link and not link.startswith("mailto:")}
    )


@pytest.mark.parametrize("link", readme_links())
def test_readme_link_resolves(link):
    path, _, anchor = link.partition("#")
    target = ROOT / path if path else ROOT / "README.md"
    assert target.exists(), f"README links to {path}, which does not exist"
    if anchor:
        assert anchor in anchors(target), f"README links to #{anchor}, which {path} has no heading or id for"
