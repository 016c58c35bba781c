"""Every reader takes time linear in its input: 100 KB of a shape costs at most 15× 10 KB of it.

Documents come from tenants with write keys, so a reader must not be made to spend quadratic time
by a crafted one. Each case is a shape that once did: a regex whose quantifiers overlapped, or a
parser that searched to the end of the text again at every unclosed construct.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from ragline.workers.retrieval.readers import Document, read_document

from tests.workers.retrieval.readers.timing import SCALE, assert_linear_time

SMALL = 10_000
LARGE = SMALL * SCALE


def assert_linear(folder: Path, suffix: str, shape: Callable[[int], str]) -> None:
    """Reading ``shape(LARGE)`` from a file costs at most RATIO_BOUND times ``shape(SMALL)``."""
    small, large = folder / f"small{suffix}", folder / f"large{suffix}"
    small.write_text(shape(SMALL), encoding="utf-8")
    large.write_text(shape(LARGE), encoding="utf-8")
    assert_linear_time(lambda: read_document(small), lambda: read_document(large))


def fill(head: str, pump: str, tail: str = "") -> Callable[[int], str]:
    """``head``, then ``pump`` repeated to about ``size`` characters, then ``tail``."""
    return lambda size: head + pump * max(1, (size - len(head) - len(tail)) // len(pump)) + tail


def _rst_descriptions_under_a_long_title(size: int) -> str:
    # Text after each description goes back under the heading, whose anchor was made again.
    title = "T" * (size // 2)
    return f"{title}\n{'=' * len(title)}\n\n" + ".. function:: f\nx\n" * (size // 2 // 17)


@pytest.mark.parametrize(
    ("suffix", "shape"),
    [
        # The cases.
        pytest.param(".md", fill("# a", " ", "b\n\nbody\n"), id="markdown-heading-of-spaces"),
        pytest.param(".txt", fill(":a:`", " ", "x\n"), id="text-role-shaped"),
        pytest.param(".html", fill("", "<a b='"), id="html-unclosed-quotes"),
        pytest.param(".md", fill("---\nkey: a", " ", "b\n---\nbody\n"), id="front-matter-value-of-spaces"),
        # Found on the way.
        pytest.param(".txt", fill("", ":a", "\n"), id="text-run-of-role-names"),
        pytest.param(".rst", fill("Words.\n\n", ":a", "\n"), id="rst-run-of-role-names"),
        pytest.param(".md", fill("```\n", "\n"), id="markdown-unclosed-fence-of-blank-lines"),
        pytest.param(".rst", fill(".. code:: python\n", "\n", "   x\n"), id="rst-code-after-blank-lines"),
        pytest.param(".rst", _rst_descriptions_under_a_long_title, id="rst-descriptions-under-long-title"),
        pytest.param(".html", fill("", "<!--"), id="html-unclosed-comments"),
        pytest.param(".html", fill("", "</"), id="html-unclosed-end-tags"),
        pytest.param(".html", fill("", "<?"), id="html-unclosed-instructions"),
        pytest.param(".html", fill("", "<a"), id="html-unclosed-start-tags"),
        pytest.param(".html", fill("<h1>", "<div>", "x"), id="html-blocks-in-a-heading"),
    ],
)
def test_shape_reads_in_linear_time(tmp_path: Path, suffix: str, shape: Callable[[int], str]) -> None:
    assert_linear(tmp_path, suffix, shape)


# --- fuzzed: shapes drawn from each reader's own constructs ---------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A document of about ``size`` characters: ``head``, then ``pump`` repeated, then ``tail``;
    that unit over and over (``pumps`` times each); or lines indented one ``pump`` deeper each
    (nesting)."""

    head: str
    pump: str
    tail: str
    form: str  # "run", "units" or "stairs"
    pumps: int

    def __call__(self, size: int) -> str:
        if self.form == "run":
            return fill(self.head, self.pump, self.tail)(size)
        if self.form == "units":
            unit = self.head + self.pump * self.pumps + self.tail
            return unit * max(1, size // len(unit))
        lines, length, depth = [self.head], len(self.head), 0
        while length < size:
            lines.append(self.pump * depth + self.tail + "\n")
            length += len(lines[-1])
            depth += 1
        return "".join(lines)


_SPACES = [" ", "  ", "\t", "\n"]
_COMMON = [*_SPACES, "\n\n", "a", "word ", "<", ">", "`", "[", "](", "]", ")", "---", "#", "*"]
_ROLES = [":", ":a:`", ":py:func:", " <x>`", "``"]
_DIRECTIVES = ["::", ".. ", ".. note::", ".. _", "=====", "   "]
_HTML_OPENERS = ["<!--", "-->", "<a", "<a b='", '"', "=", "</", "<?", "<!", "<![", "&#", "&amp", "/>"]
_HTML_TAGS = ["<div>", "<h1>", "<pre>", "<script>", "</script", "<li><ul>", "<title>"]
_PIECES = {
    ".md": [*_COMMON, "# ", "###### ", "```", "~~~", "> ", "- ", "1. ", "    ", "[a](", "![", "<!--", "|"],
    ".rst": [*_COMMON, *_ROLES, *_DIRECTIVES],
    ".html": [*_COMMON, *_HTML_OPENERS, *_HTML_TAGS],
}
_PIECES[".txt"] = _PIECES[".rst"]
_HEADS = {
    ".md": ["", "# ", "```\n", "    ", "> "],
    ".rst": ["", "Title\n=====\n\n", ":a:`", ".. code:: python\n\n", "Example::\n\n", ".. function:: f\n"],
    ".html": ["", "<h1>", "<title>", "<pre>", "<script>", "<a b='", "<h2><div>"],
    # Front matter: Markdown's block and a reST field list, opened and not always closed.
    "front matter": ["---\n", "---\nkey: ", ":key: ", ":a: b\n:c:"],
}
_HEADS[".txt"] = _HEADS[".rst"]
_PIECES["front matter"] = ["---", "\n", "key", ": ", ":", " ", "value", "'", "-", ":field: "]


def shapes(pieces: Sequence[str], heads: Sequence[str]) -> st.SearchStrategy[Shape]:
    # Runs of one or two pieces, and of whitespace above all: what made regexes backtrack.
    piece = st.lists(st.sampled_from([*pieces, *_SPACES]), min_size=1, max_size=2).map("".join)
    return st.builds(
        Shape,
        head=st.sampled_from(heads),
        pump=piece,
        tail=st.sampled_from(["", "\n", "x", "`", ">", "-->", "\n---\n"]) | piece,
        form=st.sampled_from(["run", "run", "units", "stairs"]),
        pumps=st.integers(0, 30),
    )


def _sane(document: Document) -> None:
    for section in document.sections:
        assert section.title_path and all(isinstance(t, str) for t in section.title_path)
        assert isinstance(section.anchor, str)
        assert section.text.strip()


_FUZZ = settings(
    max_examples=8,
    deadline=None,
    database=None,
    # Timing is what is checked: shrinking would run it over and over on a failure.
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _check(folder: Path, suffix: str, shape: Shape) -> None:
    assert_linear(folder, suffix, shape)
    for size in (SMALL, LARGE):
        _sane(read_document(folder / f"{'small' if size == SMALL else 'large'}{suffix}"))


@_FUZZ
@given(shape=shapes(_PIECES[".md"], _HEADS[".md"]))
def test_markdown_reads_fuzzed_shapes_in_linear_time(folder: Path, shape: Shape) -> None:
    _check(folder, ".md", shape)


@_FUZZ
@given(shape=shapes(_PIECES[".rst"], _HEADS[".rst"]))
def test_rest_reads_fuzzed_shapes_in_linear_time(folder: Path, shape: Shape) -> None:
    _check(folder, ".rst", shape)


@_FUZZ
@given(shape=shapes(_PIECES[".txt"], _HEADS[".txt"]))
def test_plain_text_reads_fuzzed_shapes_in_linear_time(folder: Path, shape: Shape) -> None:
    # Also JSON documents: their format is txt unless they say otherwise.
    _check(folder, ".txt", shape)


@_FUZZ
@given(shape=shapes(_PIECES[".html"], _HEADS[".html"]))
def test_html_reads_fuzzed_shapes_in_linear_time(folder: Path, shape: Shape) -> None:
    _check(folder, ".html", shape)


@_FUZZ
@given(shape=shapes(_PIECES["front matter"], _HEADS["front matter"]), suffix=st.sampled_from([".md", ".rst"]))
def test_front_matter_reads_fuzzed_shapes_in_linear_time(folder: Path, shape: Shape, suffix: str) -> None:
    _check(folder, suffix, shape)
