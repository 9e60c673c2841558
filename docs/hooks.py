"""MkDocs hook: the harness's docstrings are written in reStructuredText's
manner, which Markdown leaves as text.  Each Sphinx role (:class:`x`,
:meth:`y`) becomes a cross-reference that autorefs resolves when the target
is on a page, and plain code when it is not; a literal block's ``::`` marker
becomes a colon, or goes when it stands alone."""
import re

ROLE = re.compile(r":(?:mod|class|meth|func|data|attr|exc|obj):<code>(~?)([\w.]+)(\(\))?</code>")
LONE_LITERAL_MARK = re.compile(r"<p>::</p>\s*")
LITERAL_MARK = re.compile(r"::</p>")


def _reference(match: re.Match) -> str:
    short, target, call = match.group(1), match.group(2), match.group(3) or ""
    shown = target.rsplit(".", 1)[-1] if short else target
    return f'<autoref identifier="{target}" optional><code>{shown}{call}</code></autoref>'


def on_page_content(html, **kwargs):
    html = ROLE.sub(_reference, html)
    html = LONE_LITERAL_MARK.sub("", html)
    return LITERAL_MARK.sub(":</p>", html)
