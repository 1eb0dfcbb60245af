"""``headprune run P.toml --smoke`` (headprune/protocol/smoke.py): every shipped protocol runs end to end, offline, on
tiny random stand-ins of its models and data, and the stand-ins keep what the real run depends on (family, labels,
splits, columns, ClassLabel names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headprune.protocol import Protocol, expand
from headprune.protocol.smoke import build_smoke, run_smoke, source_features, stated_labels

PROTOCOLS = sorted((Path(__file__).resolve().parent.parent / "protocols").glob("*.toml"))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.mark.parametrize("path", PROTOCOLS, ids=[p.stem for p in PROTOCOLS])
def test_every_shipped_protocol_runs_end_to_end_on_stand_ins(path, tmp_path, one_thread):
    protocol = Protocol.read(path)
    out = tmp_path / "out"
    summary = run_smoke(protocol, out, online=False)
    run = json.loads((out / "run.json").read_text())
    cells = expand(protocol)
    # every cell was computed (nothing skipped), on the stand-ins it names; repeats and random orders capped at 2,
    # sparsities at the smallest and largest positive ones plus those a [[paper]] table cites (its table in full)
    assert summary["computed"] == summary["cells"] == len(run["cells"]) and summary["smoke"] is True
    positive = [r for r in protocol.sparsities if r > 0]
    cited = {r for entry in protocol.paper for c, rows in entry.values.items() if c != "dense" for r in rows}
    dropped = len(positive) > 2 and any(r not in (positive[0], positive[-1]) and all(abs(r - c) >= 1e-9 for c in cited)
                                        for r in positive)
    capped = protocol.repeats > 2 or (protocol.trajectory is not None and protocol.trajectory.random_boxes > 2) \
        or dropped
    assert (summary["cells"] < len(cells)) if capped else (summary["cells"] == len(cells))
    assert {c["key"] for c in run["cells"].values()} <= {c.key for c in cells}
    assert run["smoke"]["models"].keys() == {m.name for m in protocol.models}
    assert all(Path(m["path"]).is_dir() for m in run["smoke"]["models"].values())
    assert (out / "results.md").read_text().startswith("> **SMOKE RUN**")
    # each model's metric columns are the ones the real run reports (GLUE's set for a GLUE source)
    for entry in protocol.models:
        dense = run["cells"][next(c.key for c in cells if c.model == entry.name)]
        if entry.metrics:
            # agreement and stability compare predicted classes: a regression task (STS-B) reports neither
            regression = "mse" in dense.get("metrics", {})
            wanted = {m for m in entry.metrics if not m.startswith("lm-eval:") and m != "task"
                      and not (regression and m in ("agreement", "stability"))}
            assert set(dense.get("metrics", {})) >= wanted or dense.get("trajectory")


def entry_of(text: str):
    return Protocol.parse(text, "t.toml").models[0]


BASE = ('name = "t"\nsparsities = [0.5]\n[[criteria]]\nname = "random"\n[[models]]\nname = "m"\n'
        'model = "textattack/bert-base-uncased-MNLI"\n'
        'data.calib = { source = "hf:nyu-mll/glue:mnli:train", size = 8 }\n'
        'data.eval = { source = "hf:nyu-mll/glue:mnli:validation_matched", size = 8 }\n')


def test_stand_in_labels_follow_the_protocols_statements():
    entry = entry_of(BASE + 'label_map = { contradiction = "LABEL_0", entailment = "LABEL_1", neutral = "LABEL_2" }\n')
    features = source_features(entry.data["eval"], entry, online=False)
    assert features.names == ["entailment", "neutral", "contradiction"]         # GLUE's ClassLabel order
    assert "validation_matched" in features.splits
    assert stated_labels(entry, features)[0] == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    by_position = entry_of(BASE + "labels_by_position = true\n")
    assert stated_labels(by_position, features)[0] == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    unstated = entry_of(BASE)
    labels, how = stated_labels(unstated, features)
    assert labels == {0: "entailment", 1: "neutral", 2: "contradiction"} and how.startswith("not stated")


def test_stand_ins_refuse_what_the_real_run_would_refuse(tmp_path, one_thread):
    """A model that names its labels LABEL_0..k (as textattack's do) under a protocol that states nothing stops at
    label alignment, as the real run would; the same run with labels_by_position stated goes through."""
    from dataclasses import replace

    from headprune.errors import HeadpruneError
    from headprune.protocol.run import run_protocol
    from headprune.protocol.smoke import stand_in_model

    text = BASE.replace("MNLI", "SST-2").replace("mnli:validation_matched", "sst2:validation") \
        .replace("mnli:train", "sst2:train")
    mapped = Protocol.parse(text + 'label_map = { negative = "LABEL_0", positive = "LABEL_5" }\n', "t.toml")
    assert len(build_smoke(mapped, tmp_path / "a").models["m"]["id2label"]) == 6   # LABEL_5 stated: six outputs
    silent = Protocol.parse(text, "t.toml")
    smoke = build_smoke(silent, tmp_path / "b").protocol
    features = source_features(silent.models[0].data["eval"], silent.models[0], online=False)
    positional = stand_in_model(replace(silent.models[0], labels_by_position=True), features, tmp_path / "pos",
                                False, 0)
    assert positional.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    entry = replace(smoke.models[0], model=str(positional.path))
    with pytest.raises(HeadpruneError, match="could be matched only by position"):
        run_protocol(replace(smoke, models=(entry,)), tmp_path / "out", plots=False)
    stated = replace(entry, labels_by_position=True)
    assert run_protocol(replace(smoke, models=(stated,)), tmp_path / "ok", plots=False)["computed"] == 2


def test_plan_names_a_label_map_target_the_model_lacks_with_its_line_before_any_weights(tmp_path, tiny_model_dir,
                                                                                        monkeypatch, capsys):
    """The tiny model (labels neg/pos) on SST-2 (ClassLabel negative/positive): a map sending 'negative' to LABEL_7
    is an error naming label_map and its line, from the config alone; offline, the unreachable checks are listed."""
    from headprune.cli import main
    from headprune.model import loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    text = (f'name = "t"\nsparsities = [0.5]\n[[criteria]]\nname = "random"\n[[models]]\nname = "m"\n'
            f'model = "{tiny_model_dir}"\n'
            'data.calib = { source = "hf:nyu-mll/glue:sst2:train", size = 8 }\n'
            'data.eval = { source = "hf:nyu-mll/glue:sst2:validation", size = 8 }\n'
            'label_map = { negative = "LABEL_7", positive = "pos" }\n')
    path = tmp_path / "p.toml"
    path.write_text(text)
    assert main(["run", str(path), "--plan", "--no-timing"]) == 2
    err = capsys.readouterr().err
    assert "line 10" in err and "label_map" in err and "LABEL_7" in err and "m, data.eval" in err
    # the right map passes; a split the data set lacks is named with its role's line
    path.write_text(text.replace('"LABEL_7"', '"neg"').replace("sst2:validation", "sst2:dev"))
    assert main(["run", str(path), "--plan", "--no-timing"]) == 2
    err = capsys.readouterr().err
    assert "line 9" in err and "'dev' is not one of train, validation, test" in err and "LABEL_7" not in err
    path.write_text(text.replace('"LABEL_7"', '"neg"'))
    assert main(["run", str(path), "--plan", "--no-timing"]) == 0
    # a hub model offline: its labels are listed as not checked
    path.write_text(text.replace(str(tiny_model_dir), "textattack/bert-base-uncased-SST-2"))
    assert main(["run", str(path), "--plan", "--no-timing"]) == 0
    assert "not checked: m: labels of textattack/bert-base-uncased-SST-2" in capsys.readouterr().err


def test_a_smoke_run_keeps_the_out_folders_rules_and_resumes(tmp_path, one_thread):
    """``--out`` is checked as for a run (a folder of someone else's files is refused, untouched); a rerun into the
    smoke run's own folder rebuilds the same stand-ins and recomputes nothing."""
    from headprune.errors import HeadpruneError

    protocol = Protocol.read(next(p for p in PROTOCOLS if p.stem == "demo"))
    foreign = tmp_path / "foreign"
    (foreign / "smoke").mkdir(parents=True)
    (foreign / "smoke" / "mine.txt").write_text("a user's file")
    with pytest.raises(HeadpruneError, match="did not create"):
        run_smoke(protocol, foreign)
    assert (foreign / "smoke" / "mine.txt").read_text() == "a user's file"
    out = tmp_path / "out"
    first = run_smoke(protocol, out)
    again = run_smoke(protocol, out)
    assert first["computed"] == again["reused"] == first["cells"] and again["computed"] == 0
