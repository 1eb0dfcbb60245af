"""``run --plan`` and ``run --smoke`` with the network (headprune/protocol/smoke.py's online path), against a local
fake of the hub (tests/hub_support.py): a real HTTP server on 127.0.0.1 that huggingface_hub, transformers and
datasets reach through ``HF_ENDPOINT``, exactly as they would reach huggingface.co or a mirror. The clients are not
mocked: ``AutoConfig.from_pretrained`` downloads the served config.json and ``datasets.load_dataset_builder`` reads
the served dataset card and file listing, so these tests fail if either client asks for something the online path
does not expect (a weight file, a data file) or if the features it builds from their answers are wrong.

Served: two GLUE-like fine-tunes (textattack's SST-2 with LABEL_0/LABEL_1, as on the hub, and one naming its labels),
a RoBERTa classifier whose name does not say its family, GLUE's SST-2 config and a data set the offline table does
not know (``acme/reviews``: columns title/review, ClassLabel rating bad/okay/good, splits train/test only).
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest
from hub_support import DataConfig, FakeHub, bert_config, hub_clients_at

from headprune.cli import main
from headprune.protocol.smoke import forget_hub_reads, hub_address, hub_reachable

SST2_MODEL = "textattack/bert-base-uncased-SST-2"
NAMED_MODEL = "acme/bert-sentiment"
REVIEWS_MODEL = "acme/reviews-classifier"      # a RoBERTa: offline its name would say "bert" (the default guess)
REVIEWS_LABELS = {0: "BAD", 1: "OKAY", 2: "GOOD"}
MODELS = {SST2_MODEL: bert_config({0: "LABEL_0", 1: "LABEL_1"}),
          NAMED_MODEL: bert_config({0: "NEGATIVE", 1: "POSITIVE"}),
          REVIEWS_MODEL: {**bert_config(REVIEWS_LABELS), "model_type": "roberta",
                          "architectures": ["RobertaForSequenceClassification"], "pad_token_id": 1}}
DATASETS = {"nyu-mll/glue": {"sst2": DataConfig(("sentence",), "label", ["negative", "positive"],
                                                ("train", "validation", "test"))},
            "acme/reviews": {"plain": DataConfig(("title", "review"), "rating", ["bad", "okay", "good"],
                                                 ("train", "test"))},
            # labels the features do not name: text, integer ids, a float target; and a multiple-choice layout
            "acme/langid": {"plain": DataConfig(("text",), "labels", None, ("train", "test"), "string")},
            "acme/votes": {"plain": DataConfig(("text",), "label", None, ("train", "test"), "int64")},
            "acme/scores": {"plain": DataConfig(("sentence1", "sentence2"), "score", None, ("train",), "float32")},
            "Rowan/hellaswag": {"default": DataConfig(("ctx", "activity_label"), "label", None,
                                                      ("train", "validation"), "string", ("endings",))}}
# what a config or a data set's features may cost: these files, never a weight or a data file
# (datasets also asks whether a legacy loading script NAME.py exists, which it would refuse to run)
METADATA = {"config.json", "README.md", ".huggingface.yaml", "dataset_infos.json"}
HEAVY = re.compile(r"\.(safetensors|bin|pt|pth|h5|msgpack|ckpt|gguf|onnx|parquet|arrow|csv|jsonl|zip|gz)(\?|$)")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The fake hub, with the clients pointed at it, the network on and a fresh cache (nothing of this machine's
    cache is read); the process's memo of hub reads is cleared before and after."""
    served = FakeHub(models=MODELS, datasets=DATASETS).start()
    hub_clients_at(served, tmp_path, monkeypatch)
    forget_hub_reads()
    yield served
    served.stop()
    forget_hub_reads()


@pytest.fixture
def no_weights(monkeypatch):
    from headprune.model import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights loaded"))


def files_read(hub: FakeHub) -> set[str]:
    """The file names the clients asked the hub for (HEAD or GET of .../resolve/REV/FILE)."""
    return {p.split("?")[0].split("/resolve/", 1)[1].split("/", 1)[1] for p in hub.paths() if "/resolve/" in p}


def assert_metadata_only(hub: FakeHub) -> None:
    assert hub.requests, "the hub was never asked"
    scripts = {p.rsplit("/", 1)[1] for m, p in hub.requests if m == "HEAD" and p.endswith(".py")}
    assert files_read(hub) <= METADATA | scripts, files_read(hub)
    assert not [p for m, p in hub.requests if m == "GET" and p.endswith(".py")]
    assert not [p for p in hub.paths() if HEAVY.search(p)]


def protocol(model: str, eval_source: str, extra: str = "", calib: str | None = None, role: str = "") -> str:
    """A one-model protocol; its model key is on line 7, data.calib on 8, data.eval on 9, ``extra`` from 10."""
    calib = calib or eval_source.rsplit(":", 1)[0] + ":train"
    return (f'name = "t"\nsparsities = [0.5]\n[[criteria]]\nname = "random"\n[[models]]\nname = "m"\n'
            f'model = "{model}"\n'
            f'data.calib = {{ source = "{calib}", size = 8{role} }}\n'
            f'data.eval = {{ source = "{eval_source}", size = 8{role} }}\n' + extra)


def plan(path: Path, text: str, capsys) -> tuple[int, str]:
    path.write_text(text)
    status = main(["run", str(path), "--plan", "--no-timing"])
    return status, capsys.readouterr().err


def test_the_probe_goes_to_hf_endpoint_and_honours_offline(hub, monkeypatch):
    """``hub_reachable`` probes HF_ENDPOINT's host and port (a mirror's, here the fake hub's), not huggingface.co;
    HF_HUB_OFFLINE set now or when huggingface_hub was imported makes it offline without a connection."""
    port = int(hub.endpoint.rsplit(":", 1)[1])
    assert hub_address() == ("127.0.0.1", port)
    assert hub_reachable()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not hub_reachable()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert not hub_reachable()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    hub.stop()
    with pytest.raises(OSError):   # the port is closed now: the probe must say so, not hang or pass
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert not hub_reachable()


def test_plan_online_refuses_positional_labels_the_protocol_does_not_state(hub, no_weights, tmp_path, capsys):
    """textattack's SST-2 config names LABEL_0/LABEL_1, GLUE's ClassLabel negative/positive: with nothing stated
    the plan is an error naming the model, each role and the protocol keys that fix it, read from the served
    config.json and card alone; labels_by_position or a right label_map pass, and say the hub's features were
    checked."""
    path = tmp_path / "p.toml"
    silent = protocol(SST2_MODEL, "hf:nyu-mll/glue:sst2:validation")
    status, err = plan(path, silent, capsys)
    assert status == 2
    assert "m, data.calib:" in err and "m, data.eval:" in err and "line 7" in err and "key 'models.0.model'" in err
    assert "0=LABEL_0, 1=LABEL_1" in err and "negative -> 0 (LABEL_0)" in err
    assert 'labels_by_position = true' in err and 'label_map = { negative = "LABEL_0"' in err
    assert "nyu-mll/glue:sst2 (hub features)" in err
    assert f"read from 127.0.0.1:{hub.endpoint.rsplit(':', 1)[1]}" in err
    assert {"config.json", "README.md"} <= files_read(hub)
    assert any(p.startswith(f"/{SST2_MODEL}/resolve/") and p.endswith("/config.json") for p in hub.paths())
    assert_metadata_only(hub)

    for statement in ("labels_by_position = true\n", 'label_map = { negative = "LABEL_0", positive = "LABEL_1" }\n'):
        status, err = plan(path, silent + statement, capsys)
        assert status == 0, err
        assert "problem:" not in err and "not checked" not in err
        assert "m, data.eval (hf:nyu-mll/glue:sst2:validation): labels, split and columns (hub features)" in err
        assert "2 role(s) checked, 0 problem(s), 0 check(s) not made" in err
    # a model naming its labels as the data does (any case) needs no statement
    status, err = plan(path, protocol(NAMED_MODEL, "hf:nyu-mll/glue:sst2:validation"), capsys)
    assert status == 0 and "labels, split and columns (hub features)" in err, err
    assert_metadata_only(hub)


def test_plan_online_names_a_map_target_the_config_lacks_and_a_split_or_column_the_data_lacks(
        hub, no_weights, tmp_path, capsys):
    """Against the served config and the served features of a data set the offline table does not know: a
    label_map target the config lacks (key and line), a split the card does not list, a column it does not have;
    each by model and role, all at once."""
    path = tmp_path / "p.toml"
    columns = ', text_col = "review", label_col = "rating"'
    good = protocol(REVIEWS_MODEL, "hf:acme/reviews:plain:test", role=columns)
    status, err = plan(path, good, capsys)
    assert status == 0, err
    assert "m, data.eval (hf:acme/reviews:plain:test): labels, split and columns (hub features)" in err
    status, err = plan(path, good + 'label_map = { bad = "BAD", okay = "LABEL_7", good = "GOOD" }\n', capsys)
    assert status == 2
    assert "line 10" in err and "key 'models.0.label_map'" in err and "'okay' to 'LABEL_7'" in err
    assert "It knows: 0=BAD, 1=OKAY, 2=GOOD" in err
    wrong = protocol(REVIEWS_MODEL, "hf:acme/reviews:plain:validation", role=', text_col = "body"')
    status, err = plan(path, wrong, capsys)
    assert status == 2
    assert ("line 9: key 'models.0.data.eval.source': m: split 'validation' is not one of train, test "
            "(hub features)") in err
    assert ("line 8: key 'models.0.data.calib.text_col': m: no column 'body'; the data set has title, review, rating "
            "(hub features)") in err
    assert "line 9: key 'models.0.data.eval.text_col'" in err
    assert_metadata_only(hub)


def test_plan_says_which_checks_it_could_not_make_offline(hub, no_weights, tmp_path, capsys, monkeypatch):
    """With the hub down, or HF_HUB_OFFLINE=1 with it up (then it is never asked), the plan still passes what the
    offline table knows (GLUE's splits and columns) and lists what it could not check: the model's labels, and
    every check of a data set the table does not know."""
    path = tmp_path / "p.toml"
    text = protocol(SST2_MODEL, "hf:nyu-mll/glue:sst2:validation")
    reviews = protocol(REVIEWS_MODEL, "hf:acme/reviews:plain:validation", role=', text_col = "body"')
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for model, content in ((SST2_MODEL, text), (REVIEWS_MODEL, reviews)):
        status, err = plan(path, content, capsys)
        assert status == 0, err   # the label problem and the wrong split / column are there, but out of reach
        assert f"not checked: m: labels of {model} (its config.json is not on this machine; offline)" in err
        assert "offline: HF_HUB_OFFLINE is set or 127.0.0.1" in err
    assert "not checked: m, data.eval (hf:acme/reviews:plain:validation): its splits, columns and labels " \
           "(offline)" in err
    assert hub.requests == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    hub.stop()
    status, err = plan(path, text, capsys)
    assert status == 0 and "out of reach" in err and "not checked: m: labels of " + SST2_MODEL in err
    assert "m, data.eval (hf:nyu-mll/glue:sst2:validation): split and columns (known source)" in err


def test_plan_online_says_why_the_hub_gave_nothing(hub, no_weights, tmp_path, capsys):
    """A model or data set the (reachable) hub does not have is listed as not checked with the hub's answer."""
    path = tmp_path / "p.toml"
    status, err = plan(path, protocol("acme/missing", "hf:acme/nothing:plain:test"), capsys)
    assert status == 0, err
    assert "not checked: m: labels of acme/missing (the hub did not give its config.json: " in err
    assert "not checked: m, data.eval (hf:acme/nothing:plain:test): its splits, columns and labels (" in err
    assert "offline" not in err


def test_smoke_online_builds_the_stand_ins_from_the_served_config_and_features(hub, no_weights, tmp_path, capsys,
                                                                                one_thread):
    """``run --smoke`` online: the stand-in classifier has the served config's family (RoBERTa, which its name does
    not say) and labels (BAD/OKAY/GOOD, the config's own case), the stand-in data the served columns, ClassLabel
    names and splits; only config.json and the card were read (no weights, no rows); the table is written."""
    import datasets
    from transformers import AutoConfig

    path = tmp_path / "p.toml"
    path.write_text(protocol(REVIEWS_MODEL, "hf:acme/reviews:plain:test",
                             role=', text_col = "review", label_col = "rating"'))
    out = tmp_path / "out"
    assert main(["run", str(path), "--smoke", "--out", str(out), "--no-plots"]) == 0, capsys.readouterr().err
    run = json.loads((out / "run.json").read_text())
    model = run["smoke"]["models"]["m"]
    assert model["family"] == "roberta" and model["config"] == "its config (shrunk)"
    assert model["labels"] == "the model's config"
    assert model["id2label"] == {str(k): v for k, v in REVIEWS_LABELS.items()}
    config = AutoConfig.from_pretrained(model["path"])
    assert config.model_type == MODELS[REVIEWS_MODEL]["model_type"] and config.num_labels == len(REVIEWS_LABELS)
    assert config.id2label == REVIEWS_LABELS and config.hidden_size <= 64
    source = run["smoke"]["sources"]["acme/reviews:plain"]
    assert source["features"] == "hub features" and source["labels"] == ["bad", "okay", "good"]
    assert source["splits"] == ["train", "test"] and source["columns"] == ["title", "review", "rating"]
    stand_in = datasets.load_from_disk(source["stand_in"])
    assert list(stand_in) == ["train", "test"]
    assert stand_in["test"].features["rating"].names == ["bad", "okay", "good"]
    assert {"title", "review"} <= set(stand_in["test"].column_names)
    assert (out / "results.md").read_text().startswith("> **SMOKE RUN**")
    assert len(run["cells"]) == 2   # dense and random at 0.5
    assert_metadata_only(hub)


def test_smoke_online_stops_where_the_real_run_would_before_building(hub, no_weights, tmp_path, capsys):
    """The served LABEL_0/LABEL_1 config against GLUE's names, nothing stated: ``--smoke`` stops with the plan's
    error (model, role, line) before any stand-in is built."""
    path = tmp_path / "p.toml"
    path.write_text(protocol(SST2_MODEL, "hf:nyu-mll/glue:sst2:validation"))
    out = tmp_path / "out"
    assert main(["run", str(path), "--smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "m, data.eval:" in err and "line 7" in err and "labels_by_position = true" in err
    assert not (out / "smoke").exists()
    assert_metadata_only(hub)


def test_features_the_card_does_not_name_are_read_as_what_they_are(hub, tmp_path):
    """Online features of label columns without ClassLabel: text labels and integer ids are classes whose names
    only the rows hold (the label check says so, the stand-in takes the stated names and keeps the storage), a
    float column is a regression target; a multiple-choice data set keeps its layout (which features alone do not
    say) with the served splits."""
    import datasets

    from headprune.protocol import Protocol
    from headprune.protocol.smoke import check_labels, hf_features, source_features, write_source

    def entry(source: str, extra: str = ""):
        return Protocol.parse(protocol(NAMED_MODEL, source, extra, calib=source), "t.toml").models[0]

    langid, why = hf_features("acme/langid", "plain", online=True)
    assert (langid.label, langid.string_labels, langid.names, langid.splits, why) == \
        ("labels", True, None, ("train", "test"), "")
    votes, _ = hf_features("acme/votes", "plain", online=True)
    assert votes.id_labels and not votes.string_labels and votes.names is None
    scores, _ = hf_features("acme/scores", "plain", online=True)
    assert (scores.texts, scores.label, scores.names, scores.id_labels, scores.string_labels) == \
        (("sentence1", "sentence2"), "score", None, False, False)
    choice, _ = hf_features("Rowan/hellaswag", None, online=True)
    assert choice.choice == "hellaswag" and choice.splits == ("train", "validation")   # the known table: + test
    found = check_labels(Protocol.parse(protocol(NAMED_MODEL, "hf:acme/votes:plain:test"), "t.toml"), True)
    assert found.problems == [] and "m, data.eval (hf:acme/votes:plain:test): labels (stored as integer ids: the " \
        "classes are in the rows only)" in found.unchecked
    assert "m, data.eval (hf:acme/votes:plain:test): split and columns (hub features)" in found.checked
    # the stand-in: the stated classes, stored as the data stores them (ints without names, text)
    mapped = entry("hf:acme/votes:plain:test", 'label_map = { 0 = "NEGATIVE", 1 = "POSITIVE", 2 = "POSITIVE" }\n')
    features = source_features(mapped.data["eval"], mapped, online=True)
    assert features.id_labels and features.names == ["0", "1", "2"]
    saved = datasets.load_from_disk(str(write_source(features, ["test"], tmp_path / "votes", 0)))
    assert saved["test"].features["label"] == datasets.Value("int64")
    assert sorted(set(saved["test"]["label"])) == [0, 1, 2]
    text = entry("hf:acme/langid:plain:test", 'label_map = { en = "NEGATIVE", fr = "POSITIVE" }\n')
    assert source_features(text.data["eval"], text, online=True).names == ["en", "fr"]
    assert_metadata_only(hub)

