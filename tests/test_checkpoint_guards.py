"""Guards on real checkpoints (issue 22 item 3): a task head initialised on load is refused for scoring and pruning;
labels the model names only by position (LABEL_k) need --labels-by-position or --label-map, and the mapping used is
printed and recorded."""

from __future__ import annotations

import json

import pytest
from conftest import sentences, write_csv

from headprune.cli import main
from headprune.data import TextDataset, align_labels, label_note, parse_label_map
from headprune.errors import DataError, UntrainedHeadError
from headprune.model.loading import load_model
from headprune.workspace import Workspace

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def masked_lm_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny BERT saved as ...ForMaskedLM only: read as a classifier, its head is initialised on load."""
    from transformers import BertForMaskedLM

    from headprune.testing import tiny_config

    out = tmp_path_factory.mktemp("mlm")
    config = tiny_config("bert", num_labels=2)
    config.id2label, config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}   # the tiny CSV's label words
    BertForMaskedLM(config).save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def label_k_dir(tmp_path_factory, tiny_tokenizer):
    """A trained-looking tiny classifier whose labels are LABEL_0, LABEL_1 (transformers' default names)."""
    from headprune.testing import tiny_model

    model = tiny_model("bert", num_labels=2)
    assert model.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    out = tmp_path_factory.mktemp("label_k")
    model.save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def worded(tmp_path_factory):
    """The same 30 rows with word labels (a CSV), with integer labels (a CSV), and as a ClassLabel dataset."""
    import datasets

    root = tmp_path_factory.mktemp("labels")
    texts = sentences(30, seed=5)
    ids = [i % 2 for i in range(30)]
    names = ["negative", "positive"]
    datasets.Dataset.from_dict({"text": texts, "label": ids}, features=datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})).save_to_disk(
        str(root / "classlabel"))
    return {"words": write_csv(root / "words.csv", ["text", "label"], [[t, names[y]] for t, y in zip(texts, ids)]),
            "ids": write_csv(root / "ids.csv", ["text", "label"], list(zip(texts, ids))),
            "classlabel": f"hf:{root / 'classlabel'}", "ids_list": ids}


# -- a head initialised on load ---------------------------------------------------------------------------------------

def test_a_masked_lm_checkpoint_read_as_a_classifier_reports_its_untrained_head(masked_lm_dir, tiny_model_dir):
    loaded = load_model(str(masked_lm_dir), "cpu")
    # independently: the classifier's own parameters are exactly what the checkpoint lacked
    assert loaded.untrained_head == sorted(f"classifier.{n}" for n, _ in loaded.model.classifier.named_parameters())
    assert load_model(str(tiny_model_dir), "cpu").untrained_head == []


def test_workspace_refuses_an_untrained_head_unless_allowed(masked_lm_dir, tiny_csv):
    with pytest.raises(UntrainedHeadError, match=r"newly initialised on load.*classifier.bias.*BertForMaskedLM.*"
                                                 r"Fine-tune.*--allow-untrained-head"):
        Workspace.build(str(masked_lm_dir), tiny_csv, max_length=32)
    ws = Workspace.build(str(masked_lm_dir), tiny_csv, max_length=32, allow_untrained_head=True,
                         calib_size=8, eval_size=8)
    assert ws.info()["untrained_head"] == ["classifier.bias", "classifier.weight"] and len(ws.eval) == 8


@pytest.mark.parametrize("command", ["evaluate", "score", "prune"])
def test_cli_refuses_an_untrained_head_for_scoring_and_pruning(command, masked_lm_dir, tiny_csv, tmp_path, capsys):
    extra = {"evaluate": ["--data", tiny_csv, "--eval-size", "8"],
             "score": ["--data", tiny_csv, "--criterion", "ae", "--calib-size", "8"],
             "prune": ["--mask", str(_mask(tmp_path)), "--out", str(tmp_path / "cut")]}[command]
    argv = [command, "--model", str(masked_lm_dir), *extra, *(["--max-length", "32"] if command != "prune" else [])]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert not out and "error: " in err and "newly initialised on load" in err and not (tmp_path / "cut").exists()
    assert main([*argv, "--allow-untrained-head"]) == 0
    assert json.loads(capsys.readouterr().out)


def _mask(folder):
    path = folder / "mask.json"
    path.write_text('{"pruned": {"0": [1]}}')
    return path


# -- labels by position ----------------------------------------------------------------------------------------------

def test_integer_labels_on_a_label_k_model_are_ids_without_confirmation(label_k_dir, worded):
    ws = Workspace.build(str(label_k_dir), worded["ids"], calib_size=8, eval_size=10, max_length=32)
    assert ws.label_mapping()["by"] == "ids" and ws.notes == []


def test_classlabel_words_on_a_label_k_model_need_confirmation(label_k_dir, worded):
    with pytest.raises(DataError, match=r"words \(negative, positive\).*0=LABEL_0, 1=LABEL_1.*negative -> 0 "
                                        r"\(LABEL_0\), positive -> 1 \(LABEL_1\).*--labels-by-position.*--label-map"):
        Workspace.build(str(label_k_dir), worded["classlabel"], max_length=32)
    ws = Workspace.build(str(label_k_dir), worded["classlabel"], labels_by_position=True, calib_size=8,
                         max_length=32)
    assert ws.label_mapping() == {"by": "position", "mapping": {"negative": 0, "positive": 1}}
    assert any("labels matched by position (--labels-by-position): negative -> 0 (LABEL_0), positive -> 1 "
               "(LABEL_1)" in n for n in ws.notes)


def test_a_label_map_decides_and_must_cover_every_label(label_k_dir, worded):
    ws = Workspace.build(str(label_k_dir), worded["words"], label_map={"Negative": 1, "positive": "LABEL_0"},
                         calib_size=0, eval_size=None, max_length=32)
    # every row's label is the map's image of its word (the reverse of the position order here)
    assert ws.dataset.labels == [1 - y for y in worded["ids_list"]]
    assert ws.label_mapping() == {"by": "map", "mapping": {"positive": 0, "negative": 1}}
    with pytest.raises(DataError, match=r"does not cover the labels 'positive'"):
        Workspace.build(str(label_k_dir), worded["words"], label_map={"negative": 0}, max_length=32)
    with pytest.raises(DataError, match=r"sends 'negative' to 5, which the model does not have"):
        align_labels(TextDataset(texts=["x"], labels=["negative"]), {0: "LABEL_0", 1: "LABEL_1"},
                     label_map={"negative": 5})


def test_words_on_a_label_k_model_without_a_map_say_how_to_map_them(label_k_dir, worded):
    with pytest.raises(DataError, match=r"names its labels only by position.*--label-map"):
        Workspace.build(str(label_k_dir), worded["words"], max_length=32)
    with pytest.raises(DataError, match=r"names its labels only by position"):   # no position for bare words
        Workspace.build(str(label_k_dir), worded["words"], labels_by_position=True, max_length=32)


def test_label_note_only_when_not_matched_by_name():
    by_name = align_labels(TextDataset(texts=["x", "y"], labels=["pos", "neg"], source="s"), {0: "neg", 1: "pos"})
    assert by_name.label_match == {"by": "names", "mapping": {"neg": 0, "pos": 1}} and label_note(by_name) is None


def test_parse_label_map_from_text_and_file(tmp_path):
    assert parse_label_map('{"negative": 0, "positive": "LABEL_1"}') == {"negative": 0, "positive": "LABEL_1"}
    path = tmp_path / "map.json"
    path.write_text('{"a": 1}')
    assert parse_label_map(str(path)) == {"a": 1}
    for bad in ("{oops", "[1, 2]", "{}", '{"a": true}'):
        with pytest.raises(DataError, match="label map"):
            parse_label_map(bad)


def test_cli_prints_the_mapping_and_records_it(label_k_dir, worded, capsys):
    base = ["evaluate", "--model", str(label_k_dir), "--data", worded["classlabel"], "--max-length", "32"]
    assert main(base) == 2
    assert "--labels-by-position" in capsys.readouterr().err
    assert main([*base, "--label-map", '{"negative": 0, "positive": 1}']) == 0
    out, err = capsys.readouterr()
    assert "labels matched by the label map: negative -> 0 (LABEL_0), positive -> 1 (LABEL_1)" in err
    assert json.loads(out)["labels"] == {"by": "map", "mapping": {"negative": 0, "positive": 1}}


def test_demo_words_need_no_confirmation():
    """The demos' labels are words the model names (rotten / fresh): matched by name, nothing printed."""
    ds = align_labels(TextDataset(texts=["a", "b"], labels=["fresh", "rotten"]), {0: "rotten", 1: "fresh"})
    assert ds.label_match["by"] == "names" and ds.labels == [1, 0] and label_note(ds) is None
