"""Markdown from a user, made inert: the one definition of what in a user's words could become HTML, fetch a file
or open a link, shared by the check that refuses it (``headprune lessons check``) and the dashboard that shows
such words (``dashboard.ui.plain``).

Streamlit renders every text it shows -- st.markdown, captions, alerts, metric values, status and expander labels,
widget labels and their help -- as Markdown: with ``unsafe_allow_html`` raw HTML runs; without it, a Markdown image
``![x](http://elsewhere/x.png)`` still makes every reader's browser fetch from another host, a link can point
anywhere, and ``:material/...:``, ``:red[...]`` or ``$...$`` change what is drawn. Text a user supplied (a lesson, a
model or data name, a file or column name, a label, a token, an error message quoting any of them) goes through
:func:`inert` before it reaches a page.
"""

from __future__ import annotations

import re

# what can start Markdown structure anywhere in a line (emphasis, code, links and images, HTML and entities, autolinks,
# tables, strikethrough, maths, Streamlit's :icons: and :colour[...]), and what can only at a line's start (headings
# are "#", already in the first set; lists, setext underlines, ordered-list numbers)
INLINE = re.compile(r"[\\`*_\[\]<>!&~$:|#@]|(?<=www)\.", re.I)
LINE_START = re.compile(r"(?m)^()([-+=])|^(\d+)([.)])(?=[ \t]|$)")
CODE = re.compile(r"(`+)(?:.+?)\1", re.S)                   # a code span (or fence): shown as written
MARKUP = re.compile(r"[<>\[\]:$@\\]|(?<=www)\.", re.I)       # what turns Markdown into HTML, links, images, icons
HTML = re.compile(r"</?[A-Za-z][^<>\n]*>?|<[!?]")          # a tag (its name right after "<"), a comment
IMAGE = re.compile(r"!\[")
LINK = re.compile(r"\[[^\]\n]*\][(\[]|^[ ]{0,3}\[[^\]\n]+\]:", re.M)   # inline, reference, definition
ADDRESS = re.compile(r"\b(?:https?|ftp|file|javascript|vbscript|data|mailto)\s*:|\bwww\.", re.I)


def _reference(match: re.Match) -> str:
    return f"&#{ord(match.group())};"


def outside_code(text: str) -> str:
    """``text`` with its code spans blanked (same length: offsets stay those of ``text``)."""
    return CODE.sub(lambda m: " " * len(m.group()), text)


def inert(text, markdown: bool = False) -> str:
    """``text`` as Markdown that shows it and does nothing else, with or without ``unsafe_allow_html``.

    Plain (the default): every character that can start Markdown structure (INLINE, and LINE_START at a line's
    start) becomes a numeric character reference (``<`` is ``&#60;``), which Markdown shows as that character and
    never reads as structure (CommonMark, "Entity and numeric character references"): no HTML tag, link, image,
    emphasis, list, heading, table, ``:material/...:`` icon, ``:red[...]`` colour, ``$...$`` maths or
    ``www.``/``http:``/e-mail autolink can form, so nothing is fetched and nothing runs; the leading blanks of a
    line go too (an indented line would be a code block, which shows references as written). Other characters stay
    as they are ("MiniLM-L6 (Rotten Tomatoes)", "64 / 32"), so the page source reads as before.
    ``markdown=True`` (a lesson's words) keeps emphasis, lists and code spans and makes inert only what could fetch,
    link or run: ``< > [ ] : $ @ \\`` and ``www.`` outside code spans.

    The result is Markdown for a page: never a widget's option (options are shown as text already), never put
    inside backticks (a code span shows references as written)."""
    text = str(text)
    if not markdown:
        text = INLINE.sub(_reference, re.sub(r"(?m)^[ \t]+", "", text))
        return LINE_START.sub(lambda m: "{}&#{};".format(m.group(1) or m.group(3) or "",
                                                           ord(m.group(2) or m.group(4))), text)
    out, last = [], 0
    for code in CODE.finditer(text):
        out += [MARKUP.sub(_reference, text[last:code.start()]), code.group()]
        last = code.end()
    return "".join(out + [MARKUP.sub(_reference, text[last:])])


def markup_problem(text: str) -> tuple[str, str] | None:
    """(the offending piece, what it is) for raw HTML, an image, a link or a web address in ``text`` outside code
    spans; None for words that show as they are meant once :func:`inert` (``markdown=True``) made them safe."""
    blank = outside_code(text)
    for pattern, what in ((HTML, "raw HTML"), (IMAGE, "an image"), (LINK, "a link"), (ADDRESS, "a web address")):
        match = pattern.search(blank)
        if match:
            return text[match.start():match.start() + 60].split("\n")[0], what
    return None


__all__ = ["inert", "markup_problem", "outside_code"]
