"""reST roles read as their text: ":func:`~os.chmod`" reads "os.chmod", ":ref:`lists <tut-lists>`"
reads "lists".

What the regex ``:[\\w:+-]+:`~?!?([^`<]*?)(?:\\s*<[^`]*>)?``` replaced, found by a scan from each
backquote instead: the role's name may hold colons, and its text may end in spaces before an
explicit target, so that regex's quantifiers overlapped and it took time quadratic in a run of
either. Here every character is looked at a bounded number of times.
"""

from __future__ import annotations


def strip_roles(text: str) -> str:
    """``text`` with every role replaced by its text, leftmost first, as that regex's ``sub``."""
    out: list[str] = []
    done = 0  # everything before it is in ``out`` or was a role
    tick = text.find("`")
    while tick >= 0:
        start = _role_start(text, done, tick)
        found = None if start is None else _role_text(text, tick + 1)
        if start is None or found is None:
            tick = text.find("`", tick + 1)
            continue
        role_text, end = found
        out += (text[done:start], role_text)
        done = end
        tick = text.find("`", end)
    out.append(text[done:])
    return "".join(out)


def _is_name_char(char: str) -> bool:
    # What the regex's [\w:+-] took (\w: a letter, a digit or "_").
    return char.isalnum() or char in "_:+-"


def _role_start(text: str, done: int, tick: int) -> int | None:
    """Where the role whose text opens at ``tick`` starts (not before ``done``): the first colon of
    the run of name characters that ends in a colon just before it, leaving a name between them."""
    if tick - done < 3 or text[tick - 1] != ":":
        return None
    first = tick - 1
    # A backquote is not a name character: this walks back no further than the last one.
    while first > done and _is_name_char(text[first - 1]):
        first -= 1
    start = text.find(":", first, tick - 2)
    return None if start < 0 else start


def _role_text(text: str, opened: int) -> tuple[str, int] | None:
    """The text of a role whose backquote opened just before ``opened``, and where the role ends;
    None when it does not end."""
    begin = opened
    # "~os.chmod" reads "os.chmod", and "!" only stops Sphinx from making a link.
    if text.startswith("~", begin):
        begin += 1
    if text.startswith("!", begin):
        begin += 1
    close = text.find("`", begin)
    angle = text.find("<", begin, len(text) if close < 0 else close)
    if angle < 0:
        return None if close < 0 else (text[begin:close], close + 1)
    # "text <target>": the target ends with the ">" just before the closing backquote.
    if close < 0 or close - 1 <= angle or text[close - 1] != ">":
        return None
    end = angle
    while end > begin and text[end - 1].isspace():
        end -= 1
    return text[begin:end], close + 1
