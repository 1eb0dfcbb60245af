"""A tiny Pythia-shaped model (GPT-NeoX: fused head-interleaved query_key_value, partial rotary, parallel residual)
as a user brings it -- a folder with an offline byte-level BPE tokenizer, like Pythia's -- through the CLI (every
criterion scores it, a mask from the scores, prune, the masked stock export, evaluate) and the dashboard in a real
browser (opened from its folder on Model & data; a click on the Prune page's grid prunes a head and moves the
perplexity). The shapes of the real Pythia-160M are measured in benchmarks/bench_memory.py --models pythia.
"""

from __future__ import annotations

import json
import time

import pytest
from test_browser import metric_value, nav, wait_idle

from headprune.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pythia(tmp_path_factory) -> dict[str, str]:
    """The folder of a 3-layer x 4-head random GPT-NeoX LM and a one-column text file of the sentences its
    tokenizer was fitted on."""
    from conftest import sentences, write_csv

    from headprune.testing import offline_tokenizer, tiny_fused

    root = tmp_path_factory.mktemp("pythia")
    texts = sentences(40, seed=3, min_words=8, max_words=14)
    tokenizer = offline_tokenizer("byte-level-bpe", texts)
    model = tiny_fused("gpt-neox", vocab_size=len(tokenizer), max_positions=128)
    model.config.update({"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
                         "eos_token_id": tokenizer.eos_token_id})
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return {"model": str(root / "model"), "data": write_csv(root / "rows.csv", ["text"], [[t] for t in texts]),
            "root": str(root)}


def run(capsys, *argv) -> dict:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_every_criterion_scores_then_mask_prune_export_and_evaluate(pythia, capsys, tmp_path):
    from headprune.criteria import available

    data = ["--data", pythia["data"], "--calib-size", 8, "--eval-size", 16]
    for name in available():   # every criterion at its defaults (HIES sweeps α, SAP sweeps k, Kwon searches)
        scored = run(capsys, "score", "--model", pythia["model"], "--criterion", name, *data,
                     "--out", tmp_path / f"{name}.json")
        assert (scored["layers"], scored["heads"]) == (3, 4), name
    made = run(capsys, "mask", "--scores", tmp_path / "his.json", "--count", 3, "--out", tmp_path / "mask.json")
    mask = json.loads((tmp_path / "mask.json").read_text())
    assert sum(len(heads) for heads in mask["pruned"].values()) == 3, made
    gated = run(capsys, "evaluate", "--model", pythia["model"], "--mask", tmp_path / "mask.json", *data)
    dense = run(capsys, "evaluate", "--model", pythia["model"], *data)
    assert gated["perplexity"] != dense["perplexity"]
    for fmt in ("headprune", "masked"):
        run(capsys, "prune", "--model", pythia["model"], "--mask", tmp_path / "mask.json", "--format", fmt,
            "--out", tmp_path / fmt)
        written = run(capsys, "evaluate", "--model", tmp_path / fmt, *data)
        assert written["perplexity"] == pytest.approx(gated["perplexity"], rel=1e-5), fmt
    assert json.loads((tmp_path / "masked" / "config.json").read_text())["num_attention_heads"] == 4   # stock


def test_opens_in_the_dashboard_and_a_prune_click_answers(pythia, server, browser):
    """Model & data: a local folder and its text file (uploaded); Load; on the Prune page a click on layer 0 head 0
    prunes it and the perplexity moves (its exact value, not an estimate)."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.set_default_timeout(300_000)
    page.goto(server)
    page.get_by_text("heads left").first.wait_for()
    wait_idle(page)
    nav(page, "Model & data").click()
    page.get_by_text("Local folder").first.click()
    wait_idle(page)
    page.get_by_label("Folder with config.json").fill(pythia["model"])
    page.keyboard.press("Enter")
    page.get_by_text("Upload CSV / TSV / JSONL / TXT").first.click()
    wait_idle(page)
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(pythia["data"])
    wait_idle(page)
    page.get_by_role("button", name="Load", exact=True).click()
    page.wait_for_function("() => document.body.innerText.includes('gpt_neox')")   # the sidebar's model type
    wait_idle(page)
    nav(page, "Prune").click()
    page.get_by_text("heads left").first.wait_for()
    page.wait_for_function("() => document.body.innerText.includes('vs dense')")
    wait_idle(page)
    assert metric_value(page, "heads left") == "12 / 12"
    before = metric_value(page, "perplexity")
    page.wait_for_function("() => document.querySelector('.js-plotly-plot .scatterlayer .point')", timeout=60_000)
    box = page.locator(".js-plotly-plot .scatterlayer .point").first.bounding_box()
    start = time.perf_counter()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("() => document.body.innerText.includes('11 / 12')")
    page.wait_for_function("() => document.body.innerText.includes('vs dense')")
    seconds = time.perf_counter() - start
    wait_idle(page)
    after = metric_value(page, "perplexity")
    print(f"Pythia-shaped: perplexity dense {before}, layer 0 head 0 pruned {after}; click -> exact {seconds:.2f} s")
    assert float(after) != float(before)
    page.close()
