"""Front matter: simple ``key: value`` pairs at the top of a document, read into its metadata."""

from __future__ import annotations

import re

from ragline.workers.retrieval.readers.rest import is_underline

# Front matter is a few lines, and what it holds goes onto every chunk of its document: a block
# that has not ended by then is not front matter, and is read as the document's text.
MAX_FRONT_MATTER_CHARS = 8 * 1024

_FIELD = re.compile(r"^:([\w-]+):\s*(.*)$")
# The value is stripped afterwards: a lazy value before trailing spaces in the regex itself cost
# time quadratic in a run of spaces.
_MD_FIELD = re.compile(r"([\w-]+)\s*:(.*)")


def split_front_matter(text: str, kind: str) -> tuple[dict[str, str], str]:
    """Simple ``key: value`` front matter, removed from the text (nested YAML is not read)."""
    meta: dict[str, str] = {}
    if kind == ".md" and text.startswith("---\n"):
        end = text.find("\n---", 3, MAX_FRONT_MATTER_CHARS)
        if end > 0:
            for line in text[4:end].split("\n"):
                m = _MD_FIELD.match(line)
                if m and (value := m.group(2).strip()):
                    meta[m.group(1).lower()] = value.strip("\"'")
            return meta, text[end + 4 :].removeprefix("\n")
    if kind in (".rst", ".rst.txt"):
        lines = text.split("\n")
        i = size = 0
        # A field list at the very top, ended by a blank line (a title with a role, ":mod:`os`"
        # over its underline, is not one).
        while i < len(lines) and (m := _FIELD.match(lines[i])) and not is_underline(lines, i + 1):
            size += len(lines[i]) + 1
            if size > MAX_FRONT_MATTER_CHARS:
                return {}, text
            meta[m.group(1).lower()] = m.group(2).strip()
            i += 1
        if i < len(lines) and lines[i].strip():
            return {}, text
        return meta, "\n".join(lines[i:])
    return meta, text
