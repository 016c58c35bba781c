"""Markdown: ATX headings (``#`` … ``######``) make sections, fenced and indented code is kept whole."""

from __future__ import annotations

import re

from ragline.workers.retrieval.readers.sections import RawSection, code_block, prose_block

_MD_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def atx_heading(line: str) -> tuple[int, str | None] | None:
    """The level and title (None when empty) of ``line`` if it is an ATX heading.

    CommonMark: up to three spaces of indent (four would be a code block); one to six #s followed
    by a space, a tab or the end of the line, so "#hashtag" is not a heading; and a closing run of
    #s, after a space or a tab, is not part of the title. Scanned with string methods: as one
    regex, the title's trailing spaces and the closing run's leading ones overlapped, which cost
    time quadratic in a line of spaces.
    """
    hashes = line.lstrip(" ")
    if len(line) - len(hashes) > 3:
        return None
    after = hashes.lstrip("#")
    level = len(hashes) - len(after)
    if not 1 <= level <= 6 or after[:1] not in ("", " ", "\t"):
        return None
    title = after.strip(" \t")
    unclosed = title.rstrip("#")
    if unclosed[-1:] in (" ", "\t"):
        title = unclosed.rstrip(" \t")
    return level, title.strip() or None


def read_markdown(text: str) -> list[RawSection]:
    parts = [RawSection(0, None, "", [])]
    para: list[str] = []
    code: list[str] = []
    fence: str | None = None

    def flush_para() -> None:
        if para:
            # A paragraph indented by four spaces is an indented code block.
            is_code = all(line.startswith("    ") or not line.strip() for line in para)
            parts[-1].blocks.append(code_block(para) if is_code else prose_block(para))
            para.clear()

    for line in text.split("\n"):
        if fence is not None:
            code.append(line)
            # A fence closes only on a bare run of the same char at least as long as the opener.
            stripped = line.strip()
            if stripped.startswith(fence) and stripped == stripped[0] * len(stripped):
                fence = None
                parts[-1].blocks.append(code_block(code))
                code = []
            continue
        opener = _MD_FENCE.match(line)
        if opener:
            flush_para()
            fence, code = opener.group(1), [line]
            continue
        heading = atx_heading(line)
        if heading:
            flush_para()
            parts.append(RawSection(*heading, "", []))
            continue
        if line.strip():
            para.append(line)
        else:
            flush_para()
    if fence is not None:
        parts[-1].blocks.append(code_block(code))
    flush_para()
    return parts
