"""MkDocs hooks.

The harness's docstrings are written in reStructuredText's manner, which
Markdown leaves as text.  Each Sphinx role (:class:`x`, :meth:`y`) becomes
a cross-reference that autorefs resolves when the target is on a page, and
plain code when it is not; a literal block's ``::`` marker becomes a colon,
or goes when it stands alone.

A page links the source file a rendered reference comes from, for whoever
reads the page as a file (on GitHub, in an editor); the site holds no such
file, so there the link shows as its text."""
import os
import re

ROLE = re.compile(r":(?:mod|class|meth|func|data|attr|exc|obj):<code>(~?)([\w.]+)(\(\))?</code>")
LONE_LITERAL_MARK = re.compile(r"<p>::</p>\s*")
LITERAL_MARK = re.compile(r"::</p>")


def _reference(match: re.Match) -> str:
    short, target, call = match.group(1), match.group(2), match.group(3) or ""
    shown = target.rsplit(".", 1)[-1] if short else target
    return f'<autoref identifier="{target}" optional><code>{shown}{call}</code></autoref>'


OUTSIDE_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\((\.\./[^)\s#]+)\)")


def on_page_markdown(markdown, page, config, **kwargs):
    docs = os.path.realpath(config["docs_dir"])
    here = os.path.dirname(os.path.join(docs, page.file.src_path))

    def shown(match: re.Match) -> str:
        target = os.path.realpath(os.path.join(here, match.group(2)))
        return match.group(0) if target.startswith(docs + os.sep) else match.group(1)

    return OUTSIDE_LINK.sub(shown, markdown)


def on_page_content(html, **kwargs):
    html = ROLE.sub(_reference, html)
    html = LONE_LITERAL_MARK.sub("", html)
    return LITERAL_MARK.sub(":</p>", html)
