"""Greedy-Gnorm as the paper measured it (greedy-gnorm.txt): the protocol's models have the shapes of the paper's size
tables (Tables 2-5), and each trajectory cell saves the mask of a stated stopping rule with its size (Table 1)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from transformers import AlbertConfig, BertConfig, RobertaConfig, XLMRobertaConfig

from headprune.model.arch import adapt
from headprune.protocol import Protocol
from headprune.protocol.plan import shell_model

PROTOCOL = Path(__file__).resolve().parent.parent / "protocols" / "greedy_gnorm_fig3.toml"

# each checkpoint's config as its hub config.json states it (sizes only; no weights), with the paper's classes
CONFIGS = {
    "bardsai/finance-sentiment-zh-base": BertConfig(vocab_size=21128, num_labels=3),
    "prajjwal1/albert-base-v2-mnli": AlbertConfig(vocab_size=30000, embedding_size=128, hidden_size=768,
                                                  num_attention_heads=12, intermediate_size=3072, num_labels=3),
    "siebert/sentiment-roberta-large-english": RobertaConfig(vocab_size=50265, hidden_size=1024, num_hidden_layers=24,
                                                             num_attention_heads=16, intermediate_size=4096,
                                                             max_position_embeddings=514, type_vocab_size=1,
                                                             num_labels=2),
    "papluca/xlm-roberta-base-language-detection": XLMRobertaConfig(vocab_size=250002, max_position_embeddings=514,
                                                                    type_vocab_size=1, num_labels=20),
}
# the paper's tables (greedy-gnorm.txt, Appendix A): (table, Model params, Embeddings params, classifier params,
# classes, head-grid positions)
TABLES = {
    "BERT financial sentiment": ("Table 2", 102_269_955, 16_622_592, 2_307, 3, 144),
    "ALBERT MNLI": ("Table 3", 11_685_891, 3_906_048, 2_307, 3, 12),   # tied: 12 positions x 12 layers (Fig. 1)
    "RoBERTa tweet sentiment": ("Table 4", 355_361_794, 52_000_768, 1_051_650, 2, 384),
    "XLM-RoBERTa language identification": ("Table 5", 278_059_028, 192_398_592, 605_972, 20, 144),
}


def count(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("name", list(TABLES))
def test_each_model_has_the_parameter_and_class_counts_of_the_papers_size_tables(name):
    entry = next(m for m in Protocol.read(PROTOCOL).models if m.name == name)
    table, total, embeddings, classifier, classes, heads = TABLES[name]
    config = CONFIGS[entry.model]          # a protocol naming another checkpoint must say its shape here
    model = shell_model(config)            # meta device: shapes, no memory, no weights
    base = getattr(model, model.base_model_prefix)
    assert count(model) == total, table
    assert count(base.embeddings) == embeddings, table
    assert count(model.classifier) == classifier and config.num_labels == classes, table
    grid = adapt(model).grid_shape
    assert grid[0] * grid[1] == heads


def _tiny_protocol(tmp_path, model_dir, csv, rule: str) -> Protocol:
    """A one-criterion (AE) trajectory protocol on the tiny model, one head per step, with the saved-mask ``rule``."""
    text = (f'name = "g"\nmodels = ["{model_dir}"]\nbatch_size = 8\n\n[data.calib]\nsource = "{csv}"\n'
            f'size = 12\n\n[data.select]\nsource = "{csv}"\nsize = 16\n\n[data.eval]\nsource = "{csv}"\n'
            f'size = 20\n\n[[criteria]]\nname = "ae"\n\n[trajectory]\nstep = 1\n{rule}')
    return Protocol.parse(text, str(tmp_path / "g.toml"))


def test_the_saved_mask_is_the_last_step_within_the_tolerance_on_the_selection_rows_with_its_size(
        tmp_path, tiny_model_dir, tiny_csv, one_thread):
    import copy

    from headprune.model.loading import load_model
    from headprune.model.mask import HeadMask
    from headprune.model.surgery import prune_model
    from headprune.protocol.run import run_protocol

    protocol = _tiny_protocol(tmp_path, tiny_model_dir, tiny_csv, "mask_tolerance = 0.95\n")
    out = tmp_path / "out"
    run_protocol(protocol, out, plots=False)
    [cell] = json.loads((out / "run.json").read_text())["cells"].values()
    traj = cell["trajectory"]
    assert len(traj["steps"]) == 12                         # the run went on to the end (Figure 3's curve)
    # by hand: the last step before the selection accuracy first falls below 0.95 x its dense value
    select = [traj["select_dense"]["accuracy"]] + [s["select_metrics"]["accuracy"] for s in traj["steps"]]
    first_below = next((i for i, v in enumerate(select) if v < 0.95 * select[0]), len(select))
    step = max(first_below - 1, 0)
    saved = cell["saved_mask"]
    assert saved["step"] == step and "selection rows" in saved["rule"]
    mask = HeadMask.load(out / cell["mask"], (3, 4))
    assert mask.n_pruned == step
    # the size: parameters of the model physically cut to that mask, 4 bytes each, in MB (2^20)
    model = load_model(str(tiny_model_dir), "cpu").model
    cut = prune_model(copy.deepcopy(model), mask)
    assert saved["size"]["params_before"] == count(model)
    assert saved["size"]["params_after"] == count(cut)
    assert saved["size"]["mb_after"] == pytest.approx(count(cut) * 4 / 2 ** 20)
    md = (out / "results.md").read_text()
    assert "## The saved masks (last step within 0.95 x dense accuracy on the selection rows)" in md
    assert f"{count(model):,} | {count(cut):,} |" in md


def test_plan_checks_the_bert_rows_expected_config_against_the_models_config(tmp_path, tiny_csv):
    """`expect_config` (Table 2's shape) against a config on this machine: agreeing keys are a checked line naming
    the vocabulary and the classes, a differing key is a problem naming it; a hub id out of reach is unchecked."""
    from headprune.protocol.smoke import check_labels

    row = next(m for m in Protocol.read(PROTOCOL).models if m.name == "BERT financial sentiment")
    expected = dict(row.expect_config)
    assert expected["vocab_size"] == 21128 and expected["num_labels"] == 3   # Table 2: V = 21,128, 3 classes

    def check(model, vocab):
        folder = tmp_path / f"m{vocab}"
        BertConfig(vocab_size=vocab, num_labels=3, id2label={0: "negative", 1: "neutral", 2: "positive"},
                   label2id={"negative": 0, "neutral": 1, "positive": 2}).save_pretrained(folder)
        text = (f'name = "b"\nbatch_size = 8\nsparsities = [0.5]\n[data.calib]\nsource = "{tiny_csv}"\nsize = 4\n'
                f'[data.eval]\nsource = "{tiny_csv}"\nsize = 4\n[[criteria]]\nname = "random"\n'
                f'[[models]]\nmodel = "{model or folder}"\nexpect_config = {{ vocab_size = 21128, num_labels = 3 }}\n')
        return check_labels(Protocol.parse(text, str(tmp_path / "b.toml")), online=False)

    agree = check(None, 21128)
    assert any("vocabulary 21128, 3 classes: negative, neutral, positive" in line for line in agree.checked)
    assert not agree.problems
    differ = check(None, 30522)
    assert any("vocab_size is 30522, the paper's shape needs 21128" in p for p in differ.problems)
    offline = check("nobody/not-a-cached-model", 0)
    assert any("the paper's shape" in u and "offline" in u for u in offline.unchecked)


def _first_sharp_drop(ratios, values, drop, window):
    """The inflection point written out plainly: the first i whose next points within ``window`` (at least one)
    are all more than drop x values[0] below values[i]."""
    for i in range(len(values) - 1):
        ahead = [j for j in range(i + 1, len(values)) if ratios[j] - ratios[i] <= window + 1e-12] or [i + 1]
        if all(values[i] - values[j] > drop * abs(values[0]) for j in ahead):
            return i
    return len(values) - 1


def test_inflection_detector_finds_the_first_sharp_drop():
    from headprune.trajectory import inflection_index

    ratios = [i / 10 for i in range(11)]
    flat_then_cliff = [0.9, 0.9, 0.89, 0.9, 0.88, 0.87, 0.6, 0.5, 0.4, 0.3, 0.2]
    assert inflection_index(ratios, flat_then_cliff, drop=0.05, window=0.1) == 5      # 0.87 -> 0.60
    # a wider window: at 0.88 the next point (0.87) is no sharp drop yet; the fall starts after 0.87
    assert inflection_index(ratios, flat_then_cliff, drop=0.05, window=0.25) == 5
    # a single noisy point the curve recovers from (the demo's first step on 64 selection rows: 0.859 -> 0.812)
    noisy_then_cliff = [0.859, 0.812, 0.859, 0.844, 0.859, 0.844, 0.6, 0.5, 0.4, 0.3, 0.2]
    assert inflection_index(ratios, noisy_then_cliff, drop=0.05, window=0.2) == 5
    assert inflection_index(ratios, [0.9] * 11, drop=0.05, window=0.1) == 10          # no drop: the end
    rng = __import__("random").Random(0)
    for _ in range(50):   # against the plain loop on random curves and parameters
        values = [rng.uniform(0, 1) for _ in range(11)]
        drop, window = rng.choice([0.01, 0.05, 0.2]), rng.choice([0.05, 0.1, 0.3])
        assert inflection_index(ratios, values, drop=drop, window=window) == \
            _first_sharp_drop(ratios, values, drop, window)
    # lower is better (perplexity): a sharp RISE is the drop
    assert inflection_index(ratios, [10, 10, 10.2, 30, 40, 50, 60, 70, 80, 90, 99], False, 0.05, 0.1) == 2


def test_the_inflection_rule_saves_its_point_and_reports_the_tolerance_point_beside_it(
        tmp_path, tiny_model_dir, tiny_csv, one_thread):
    from headprune.protocol.run import run_protocol

    protocol = _tiny_protocol(tmp_path, tiny_model_dir, tiny_csv, 'mask_rule = "inflection"\n'
                              'inflection = { drop = 0.05, window = 0.2 }\nmask_tolerance = 0.95\n')
    out = tmp_path / "out"
    run_protocol(protocol, out, plots=False)
    [cell] = json.loads((out / "run.json").read_text())["cells"].values()
    traj = cell["trajectory"]
    ratios = [0.0] + [s["ratio"] for s in traj["steps"]]
    select = [traj["select_dense"]["accuracy"]] + [s["select_metrics"]["accuracy"] for s in traj["steps"]]
    inflection = _first_sharp_drop(ratios, select, 0.05, 0.2)
    first_below = next((i for i, v in enumerate(select) if v < 0.95 * select[0]), len(select))
    tolerance = max(first_below - 1, 0)
    saved = cell["saved_mask"]
    assert saved["step"] == inflection and saved["rule"].startswith("inflection point")
    assert saved["points"]["inflection"]["step"] == inflection and saved["points"]["tolerance"]["step"] == tolerance
    assert saved["points"]["tolerance"]["ratio"] == pytest.approx(ratios[tolerance])
    md = (out / "results.md").read_text()
    assert "inflection point ratio | tolerance point ratio |" in md
    assert f"| {ratios[inflection]:.4f} | {ratios[inflection]:.4f} | {ratios[tolerance]:.4f} |" in md


@pytest.mark.parametrize("table, message", [
    ('mask_rule = "knee"', '"tolerance" or "inflection"'),
    ('mask_rule = "tolerance"', "give mask_tolerance"),
    ('inflection = { drop = 0.05 }', "mask_rule"),
    ('mask_rule = "inflection"\ninflection = { drop = 2 }', "not a share in (0, 1]"),
    ('mask_rule = "inflection"\ninflection = { drop = nan }', "not a share in (0, 1]"),
    ('mask_rule = "inflection"\ninflection = { slope = 1 }', "drop = SHARE, window = SHARE"),
])
def test_bad_inflection_settings_are_refused_naming_the_key(tmp_path, table, message):
    from headprune.protocol.spec import ProtocolError

    text = ('name = "g"\nmodels = ["demo"]\n[data.calib]\nsource = "demo"\nsize = 4\n[data.eval]\nsource = "demo"\n'
            f'size = 4\n[[criteria]]\nname = "ae"\n[trajectory]\nstep = 1\n{table}\n')
    with pytest.raises(ProtocolError, match=re.escape(message)):
        Protocol.parse(text, str(tmp_path / "g.toml"))
