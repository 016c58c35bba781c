"""`ragline eval`: labelled sets, configurations, the figures, and a run against a real index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ragline.broker.config.settings import Settings
from ragline.broker.contract.messages import Source

from ragline import eval as evaluation
from ragline.cli import main


def _source(path: str, anchor: str = "") -> Source:
    return Source(chunk_id="c", source=f"/docs/{path}", title="t", text="x", score=1.0, anchor=anchor)


def test_labels_configs_and_matching(tmp_path: Path) -> None:
    tsv = tmp_path / "set.tsv"
    tsv.write_text("# comment\n\nHow?\tlibrary/os.rst.txt\tchmod\nWhy?\tfaq/a.rst.txt#why\n")
    how, why = evaluation.read_labels(tsv)
    assert (how.path, how.anchor, how.hint) == ("library/os.rst.txt", "", "chmod")
    assert (why.path, why.anchor, why.hint) == ("faq/a.rst.txt", "why", "")
    assert evaluation.matches(_source("library/os.rst.txt", "os.chmod"), how)
    assert not evaluation.matches(_source("library/os.path.rst.txt"), how)
    assert not evaluation.matches(_source("faq/a.rst.txt", "other"), why)

    config = evaluation.parse_config("hybrid-nodiv@rrf_k=20;max_chunks_per_file=2")
    assert (config.mode, config.diversity, config.overrides) == (
        "hybrid",
        False,
        {"rrf_k": "20", "max_chunks_per_file": "2"},
    )
    assert evaluation.parse_config("default").mode is None
    for bad in ("sparse", "dense@rrf_k"):
        with pytest.raises(ValueError):
            evaluation.parse_config(bad)
    (tmp_path / "bad.tsv").write_text("only a question\n")
    with pytest.raises(ValueError, match=r"bad\.tsv:1"):
        evaluation.read_labels(tmp_path / "bad.tsv")


def test_figures() -> None:
    labels = [evaluation.Label(f"q{i}", "a.rst", "", "seven") for i in range(4)]
    answers = [
        evaluation.Answer([_source("a.rst")], 0.010, text="at seven [1]", cited=1),
        evaluation.Answer([_source("b.rst"), _source("a.rst")], 0.020, text="no", cited=0),
        evaluation.Answer([_source("b.rst")] * 6 + [_source("a.rst")], 0.030, text="Seven", cited=0),
        evaluation.Answer([_source("b.rst")] * 10 + [_source("a.rst")], 0.040, text="", cited=2),
    ]
    figures = evaluation.score(labels, answers)
    assert figures["recall@1"] == 0.25 and figures["recall@5"] == 0.5 and figures["recall@10"] == 0.75
    assert figures["mrr@10"] == pytest.approx((1 + 1 / 2 + 1 / 7) / 4)
    assert figures["p50_ms"] == pytest.approx(25.0)
    assert figures["hint_rate"] == 0.5 and figures["uncited_rate"] == 0.5


@pytest.mark.integration
def test_in_process_against_a_real_index(
    settings: Settings, test_index: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    tsv = tmp_path / "cafe.tsv"
    tsv.write_text(
        "When does the cafe open in the morning?\tcafe.md#café-lumière\t7:15\n"
        "How often should a bicycle chain be oiled?\tbicycle.md\t300\n"
        "What temperature is right for green tea?\ttea.md\t80\n"
    )
    from ragline.broker.config import settings as settings_module

    monkeypatch.setattr(settings_module, "get_settings", lambda: settings)
    monkeypatch.setattr("ragline.cli.get_settings", lambda: settings)
    code = main(
        ["eval", str(tsv), "--index", test_index, "--in-process", "--compare", "dense,lexical,hybrid-nodiv"]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "| configuration | recall@1 | recall@5 | recall@10 | mrr@10 | p50_ms |" in out
    figures = json.loads(out.strip().splitlines()[-1])["cafe.tsv"]
    assert set(figures) == {"dense", "lexical", "hybrid-nodiv"}
    assert figures["dense"]["recall@1"] == 1.0 and figures["hybrid-nodiv"]["recall@1"] == 1.0
    assert main(["eval", str(tsv), "--in-process", "--rag"]) == 2  # answers need a running API


def test_sources_of_an_index_without_anchors_match_by_their_heading() -> None:
    label = evaluation.Label("Why is it slow?", "faq/a.rst.txt", "faq-slow", "")
    old = Source(chunk_id="c", source="/d/faq/a.rst.txt", title="Why is it slow?", text="x", score=1.0)
    assert evaluation.matches(old, label)
    section = evaluation.Label("q", "faq/a.rst.txt", "general-questions", "")
    assert evaluation.matches(old.model_copy(update={"title": "General Questions"}), section)
    assert not evaluation.matches(old.model_copy(update={"title": "Other"}), section)
