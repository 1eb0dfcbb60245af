"""Lesson files (issue 36 item 1): the shipped lessons load, and every bad input is an error naming file and line
while the other lessons of the folder still load."""

import os
from pathlib import Path

import pytest

from headprune.cli import main as cli_main
from headprune.lessons import MAX_BYTES, SHIPPED, LessonError, load_lessons, read_lesson
from headprune.viewstate import PAGE_NAMES

PAGES = ["head-scores", "roles", "attention", "prune", "heads", "example", "glossary", "lessons"]

GOOD = '''title = "A lesson"
summary = "Two steps."
minutes = 5
model = "demo"
data = "demo"

[[step]]
title = "First"
page = "heads"
text = "Look."

[[step]]
title = "Second"
page = "prune"
mask = "0.1,5.2-3"
head = "5.11"
criteria = ["ae", "his"]
ratio = 0.5
roles = true
text = """
Several
lines."""
question = "Why?"
answer = "Because."
'''


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def line_of(text: str, needle: str, occurrence: int = 1) -> int:
    """1-based line of the ``occurrence``-th line containing ``needle`` (found independently of the reader)."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    return hits[occurrence - 1]


def test_the_shipped_lessons_load_and_link_to_each_step():
    from dashboard.ui import PAGES as DASHBOARD_PAGES  # the pages a step may open: the dashboard's own list

    # the library's copy of the page names (what `headprune lessons check` checks against) is the dashboard's
    assert tuple(url for *_, url in DASHBOARD_PAGES) == PAGE_NAMES
    lessons, errors = load_lessons([SHIPPED], pages=[url for *_, url in DASHBOARD_PAGES])
    assert errors == []
    assert {"what-a-head-looks-at", "most-heads-can-go", "induction-heads"} <= set(lessons)
    for lesson in lessons.values():
        assert lesson.minutes <= 15 and lesson.steps
        for k, step in enumerate(lesson.steps, start=1):
            query = lesson.query(k)
            assert query["lesson"] == lesson.name and query["step"] == str(k) and query["page"] == step.state.page
            assert step.text and step.title


def test_a_good_lesson_reads_every_field(tmp_path):
    lesson = read_lesson(write(tmp_path, "good-one", GOOD), pages=PAGES)
    second = lesson.steps[1]
    assert second.state.mask == ((0, 1), (5, 2), (5, 3)) and second.state.head == (5, 11)
    assert second.state.criteria == ("ae", "his") and second.state.ratio == 0.5 and second.state.roles is True
    assert second.text == "Several\nlines." and second.answer == "Because."
    assert lesson.query(2) == {"page": "prune", "model": "demo", "data": "demo", "mask": "0.1,5.2,5.3", "head": "5.11",
                               "criteria": "ae,his", "ratio": "0.5", "roles": "1", "lesson": "good-one", "step": "2"}


BAD = {
    # name: (replace this, with that, the line's needle (occurrence), words the message must hold)
    "missing-field": ('title = "Second"\n', "", ("[[step]]", 2), "'title' is missing"),
    "missing-top": ('minutes = 5\n', "", ("title = \"A lesson\"", 1), "'minutes' must be"),
    "unknown-page": ('page = "prune"', 'page = "nowhere"', ('page = "nowhere"', 1), "not one of"),
    "unknown-head": ('head = "5.11"', 'head = "6.0"', ('head = "6.0"', 1), "outside the 6 x 12 grid"),
    "bad-mask": ('mask = "0.1,5.2-3"', 'mask = "0.1,2.12"', ('mask = "0.1,2.12"', 1), "outside the 6 x 12 grid"),
    "bad-ratio": ("ratio = 0.5", "ratio = 7", ("ratio = 7", 1), "[0, 1]"),
    "bad-criterion": ('criteria = ["ae", "his"]', 'criteria = ["ae", "nope"]', ("criteria =", 1), "'nope'"),
    "unknown-key": ('roles = true', 'roles = true\ncolour = "red"', ('colour = "red"', 1), "unknown key 'colour'"),
    "no-answer": ('answer = "Because."\n', "", ('question = "Why?"', 1), "no 'answer'"),
    "outside-model": ('model = "demo"', 'model = "../elsewhere"', ('model = "../elsewhere"', 1),
                      "outside the lessons folder"),
    "absolute-model": ('model = "demo"', 'model = "/etc"', ('model = "/etc"', 1), "outside the lessons folder"),
    "broken-toml": ('ratio = 0.5', 'ratio = = 0.5', ("ratio = = 0.5", 1), "not valid TOML"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_lesson_names_file_and_line_and_the_rest_still_load(tmp_path, case):
    old, new, (needle, occurrence), words = BAD[case]
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    bad = write(tmp_path, case, text)
    write(tmp_path, "fine", GOOD)
    lessons, errors = load_lessons([tmp_path], pages=PAGES)
    assert list(lessons) == ["fine"]
    line = line_of(text, needle, occurrence)
    assert any(e.startswith(f"{bad}:{line}: ") and words in e for e in errors), (line, errors)
    with pytest.raises(LessonError):
        read_lesson(bad, pages=PAGES)


def test_a_10_mb_lesson_is_refused_unread(tmp_path):
    big = tmp_path / "huge.toml"
    with big.open("w") as f:
        f.write(GOOD)
        f.write("# " + "x" * (10 * 1024 * 1024) + "\n")
    write(tmp_path, "fine", GOOD)
    lessons, errors = load_lessons([tmp_path], pages=PAGES)
    assert list(lessons) == ["fine"]
    assert len(errors) == 1 and errors[0].startswith(f"{big}:1: lesson file {big} is {big.stat().st_size:,} bytes, "
                                                     f"over the {MAX_BYTES:,} bytes read")


def test_a_model_folder_inside_the_lessons_folder_is_accepted_and_a_symlink_out_is_not(tmp_path):
    inside = tmp_path / "models" / "tiny"
    inside.mkdir(parents=True)
    (inside / "config.json").write_text('{"num_hidden_layers": 2, "num_attention_heads": 4}')
    lesson = read_lesson(write(tmp_path, "own-model", GOOD.replace('model = "demo"', 'model = "models/tiny"')
                               .replace('head = "5.11"', 'head = "1.3"').replace('mask = "0.1,5.2-3"', 'mask = "0.1"')),
                         pages=PAGES)
    assert lesson.model == str(inside.resolve()) and not lesson.linkable
    assert "model" not in lesson.query(2)                # a link never names a folder
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "config.json").write_text('{"num_hidden_layers": 2, "num_attention_heads": 4}')
    os.symlink(outside, tmp_path / "models" / "escape")
    with pytest.raises(LessonError, match=r"escape' is outside the lessons folder"):
        read_lesson(write(tmp_path, "sneaky", GOOD.replace('model = "demo"', 'model = "models/escape"')), pages=PAGES)


def test_two_lessons_of_one_name_and_a_missing_folder(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    write(first, "same", GOOD)
    write(second, "same", GOOD)
    lessons, errors = load_lessons([first, second, tmp_path / "none"], pages=PAGES)
    assert lessons["same"].path.parent == first
    assert any("already loaded" in e and e.startswith(f"{second / 'same.toml'}:1:") for e in errors)
    assert any("not a folder of lessons" in e for e in errors)


def test_lessons_check_prints_the_pages_error_lines_and_exits_2_on_a_bad_file(tmp_path, capsys):
    text = GOOD.replace('page = "prune"', 'page = "nowhere"').replace("ratio = 0.5", "ratio = 7")
    bad = write(tmp_path, "bad-one", text)
    write(tmp_path, "fine", GOOD)
    _, page_lines = load_lessons([tmp_path], pages=PAGE_NAMES)       # what the Lessons page lists
    assert cli_main(["lessons", "check", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and lines[:-1] == [f"error: {line}" for line in page_lines]
    assert {line.split(":")[2] for line in lines[:-1]} == {str(line_of(text, "nowhere")), str(line_of(text, "= 7"))}
    assert all(line.startswith(f"error: {bad}:") for line in lines[:-1])
    assert lines[-1] == "error: 2 problem(s) in 1 file(s); 1 of 2 lesson file(s) are usable."
    # one file named alone is checked alone; a path that is neither a file nor a folder is an error too
    assert cli_main(["lessons", "check", str(tmp_path / "fine.toml")]) == 0
    assert cli_main(["lessons", "check", str(tmp_path / "none")]) == 2
    assert "not a folder of lessons or a lesson file" in capsys.readouterr().err


def test_lessons_check_passes_the_shipped_folder_with_a_summary(capsys):
    import json

    assert cli_main(["lessons", "check", str(SHIPPED)]) == 0
    result = json.loads(capsys.readouterr().out)
    shipped = sorted(SHIPPED.glob("*.toml"))
    assert result["checked"] == len(shipped) and [x["file"] for x in result["lessons"]] == list(map(str, shipped))
    assert result["summary"] == f"{len(shipped)} lesson(s) in {len(shipped)} file(s), no errors"


# -- issue 46: a lesson file is hostile input ------------------------------------------------------------------------

HOSTILE = "<img src=x onerror=alert(1)>"
FIELDS = {(): ("title", "summary"), ("step", 0): ("title", "text", "look", "question", "answer")}


def hostile_lesson(payloads: dict[str, str]) -> str:
    """GOOD's first step with a question, every text field holding ``payloads[field]`` (one field a line)."""
    text = GOOD.replace('title = "A lesson"', f'title = "A lesson {payloads["title"]}"')
    text = text.replace('summary = "Two steps."', f'summary = "Two steps. {payloads["summary"]}"')
    return text.replace('title = "First"\npage = "heads"\ntext = "Look."',
                        f'title = "First {payloads["step title"]}"\npage = "heads"\ntext = "Look. {payloads["text"]}"'
                        f'\nlook = "Here: {payloads["look"]}"\nquestion = "Why {payloads["question"]}?"\n'
                        f'answer = "Because {payloads["answer"]}."')


@pytest.mark.parametrize("payload", [HOSTILE, "<script>alert(1)</script>", "<!-- hidden -->",
                                     "![x](http://127.0.0.2:9/x.png)", "[click](javascript:alert(1))",
                                     "see http://127.0.0.2:9/x", "www.example.invalid", "[x]: http://127.0.0.2/"])
def test_raw_html_images_and_links_are_refused_in_every_field_with_its_line(tmp_path, payload):
    keys = ("title", "summary", "step title", "text", "look", "question", "answer")
    text = hostile_lesson(dict.fromkeys(keys, payload.replace('"', "'")))
    bad = write(tmp_path, "hostile", text)
    lessons, errors = load_lessons([tmp_path], pages=PAGES)
    assert lessons == {}
    needles = {"title": 'title = "A lesson', "summary": "summary =", "step title": 'title = "First',
               "text": 'text = "Look.', "look": "look =", "question": "question =", "answer": "answer ="}
    for key, needle in needles.items():
        field = "title" if key == "step title" else key
        where = f"step 1 '{field}'" if key not in ("title", "summary") else f"'{field}'"
        line = line_of(text, needle)
        assert any(e.startswith(f"{bad}:{line}: {where} holds ") for e in errors), (key, line, errors)
    assert all("refused" in e for e in errors if " holds " in e)


def test_markup_in_a_steps_sentence_is_refused(tmp_path):
    text = GOOD.replace('title = "First"', 'title = "First"\nsentence = "the <a href=\'http://127.0.0.2/\'>film</a>"')
    bad = write(tmp_path, "sentence", text)
    with pytest.raises(LessonError) as caught:
        read_lesson(bad, pages=PAGES)
    assert str(caught.value).startswith(f"{bad}:{line_of(text, 'sentence =')}: step 1 'sentence' holds raw HTML")


def test_a_tag_in_a_code_span_and_brackets_as_words_are_fine(tmp_path):
    text = GOOD.replace('text = "Look."', 'text = "The model starts with `<bos>`; a < b; tokens [CLS] and [SEP]."')
    lesson = read_lesson(write(tmp_path, "words", text), pages=PAGES)
    assert "`<bos>`" in lesson.steps[0].text


def test_a_multi_line_text_names_the_line_of_the_html_inside_it(tmp_path):
    text = GOOD.replace('Several\nlines."""', f'Several\nlines\nand {HOSTILE}\nmore."""')
    bad = write(tmp_path, "deep", text)
    with pytest.raises(LessonError) as caught:
        read_lesson(bad, pages=PAGES)
    assert str(caught.value).startswith(f"{bad}:{line_of(text, HOSTILE)}: step 2 'text' holds raw HTML")


STEP_WORDS = {
    # name: (the prune step's text, the problem's words or None when fine)
    "missing-control": ("Press **Prune the lowest 50%**.", "names the control 'Prune the lowest 50%', which the prune "
                                                           "page (4_Prune.py) does not have"),
    "control": ("Press **Apply**, then click \\\"Undo\\\" and set **Criterion** to random.", None),
    "follows-no-mask": ("It follows the mask you set on the Prune page.", "follows a mask"),
    "measured": ("Perplexity was 931 here.", "quotes '931'"),
    "measured-decimal": ("Accuracy 0.84 here.", "quotes '0.84'"),
    "placeholders": ("{dense} then {pruned:,.1f}, {change~-0.1+-0.2}, {pruned_accuracy~0.8+-5%}, {heads_left} of "
                     "{heads} on {rows} rows ({metric}); Olsson et al. (2022), 50% of head 1.5, `0.5`.", None),
    "unknown-placeholder": ("It is {prune}.", "unknown placeholder {prune}"),
    "bad-format": ("It is {pruned:.2q}.", "is not a number format"),
    "bad-tolerance": ("It is {pruned~about six}.", "a stated value is a number"),
    "duration": ("Press **Apply** (seconds on the demo).", "promises a duration ('seconds')"),
    "ordinal": ("The second copy is copied.", None),
}


@pytest.mark.parametrize("case", sorted(STEP_WORDS))
def test_a_steps_words_match_its_page(tmp_path, case):
    words, problem = STEP_WORDS[case]
    text = GOOD.replace('title = "Second"\npage = "prune"\nmask = "0.1,5.2-3"\n',
                        f'title = "Second"\npage = "prune"\nlook = "{words}"\n')
    path = write(tmp_path, case, text)
    if problem is None:
        assert read_lesson(path, pages=PAGES).steps[1].look
        return
    with pytest.raises(LessonError) as caught:
        read_lesson(path, pages=PAGES)
    assert f"{path}:{line_of(text, 'look =')}: step 2 'look'" in str(caught.value) and problem in str(caught.value)


def test_a_placeholder_in_a_title_is_refused(tmp_path):
    with pytest.raises(LessonError, match=r"'title': a placeholder \(\{dense\}\) is filled only in a step's text"):
        read_lesson(write(tmp_path, "title", GOOD.replace('title = "First"', 'title = "First {dense}"')), pages=PAGES)


def test_fill_writes_the_live_values_and_says_when_one_is_off():
    from headprune.lessons import fill

    text = "dense {dense}, cut {pruned~6100+-10%}, {pruned:,.0f}, {heads_left} left, {metric}, `{dense}` as code"
    filled, notes = fill(text, {"dense": 1.1093, "pruned": 6100.84, "heads_left": 66, "metric": "perplexity"})
    assert filled == "dense 1.109, cut 6,101, 6,101, 66 left, perplexity, `{dense}` as code" and notes == []
    filled, notes = fill(text, {"dense": 1.1093, "pruned": 2.5, "heads_left": 66, "metric": "perplexity"})
    assert "cut 2.500" in filled and notes == ["this lesson expects pruned near 6100 (within 10%); this server "
                                               "measures 2.500"]
    assert fill("{rows} rows", {})[1] == ["{rows} has no value on this page"]


def test_every_lesson_file_is_read_through_the_safe_reader(tmp_path):
    """A FIFO does not hang the check, a symlink out of the folder is not read, 201 files are not 200 silently."""
    import signal

    from headprune.lessons import folders_stamp

    folder = tmp_path / "lessons"
    folder.mkdir()
    write(folder, "fine", GOOD)
    os.mkfifo(folder / "pipe.toml")
    outside = tmp_path / "elsewhere.toml"
    outside.write_text(GOOD)
    os.symlink(outside, folder / "linked.toml")
    os.symlink(tmp_path / "gone.toml", folder / "dangling.toml")
    signal.alarm(60)      # a FIFO opened for reading would block here forever
    try:
        lessons, errors = load_lessons([folder], pages=PAGES)
        stamp = folders_stamp([folder])           # what the dashboard re-reads on: never a crash on any of them
    finally:
        signal.alarm(0)
    assert [Path(name).name for name, *_ in stamp] == ["dangling.toml", "fine.toml", "linked.toml", "pipe.toml"]
    assert any(e.startswith(f"{folder / 'dangling.toml'}:1: ") for e in errors), errors
    assert list(lessons) == ["fine"]
    assert any(e.startswith(f"{folder / 'pipe.toml'}:1: ") and "a FIFO" in e for e in errors), errors
    assert any(e.startswith(f"{folder / 'linked.toml'}:1: ") and "not inside" in e for e in errors), errors


def test_201_lesson_files_are_an_error_naming_the_ones_left_unread(tmp_path, capsys):
    from headprune.lessons import MAX_FILES

    for i in range(MAX_FILES + 1):
        write(tmp_path, f"l{i:03d}", GOOD)
    assert cli_main(["lessons", "check", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (f"error: {tmp_path}: {MAX_FILES + 1} lesson files, over the {MAX_FILES} read from one folder: the first "
            f"{MAX_FILES} by name were checked, the other 1 (from l{MAX_FILES:03d}.toml) were not") in err


def own_model(tmp_path: Path, config: str) -> Path:
    inside = tmp_path / "models" / "tiny"
    inside.mkdir(parents=True, exist_ok=True)
    (inside / "config.json").write_text(config)
    return write(tmp_path, "own", GOOD.replace('model = "demo"', 'model = "models/tiny"')
                 .replace('head = "5.11"', 'head = "1.3"').replace('mask = "0.1,5.2-3"', 'mask = "0.1"'))


@pytest.mark.parametrize("layers", ["0", "1000000000", '"six"', "true"])
def test_a_lesson_model_with_an_impossible_grid_is_a_clear_error(tmp_path, layers):
    path = own_model(tmp_path, f'{{"num_hidden_layers": {layers}, "num_attention_heads": 4}}')
    with pytest.raises(LessonError) as caught:
        read_lesson(path, pages=PAGES)
    assert f"{path}:{line_of(path.read_text(), 'model =')}: model folder 'models/tiny': " in str(caught.value)
    shown = {"0": "0", "1000000000": "1000000000", '"six"': "'six'", "true": "True"}[layers]
    assert f"num_hidden_layers {shown} must be an integer in [1, 4096]" in str(caught.value)


def test_a_lesson_model_folder_never_makes_the_server_read_a_file_elsewhere(tmp_path):
    path = own_model(tmp_path, '{"num_hidden_layers": 2, "num_attention_heads": 4}')
    assert read_lesson(path, pages=PAGES).model == str((tmp_path / "models" / "tiny").resolve())
    secret = tmp_path.parent / f"{tmp_path.name}-secret.json"
    secret.write_text('{"num_hidden_layers": 2, "num_attention_heads": 4}')
    config = tmp_path / "models" / "tiny" / "config.json"
    config.unlink()
    os.symlink(secret, config)                        # config.json itself links out of the lessons folder
    with pytest.raises(LessonError, match="config.json is outside the lessons folder once its links are followed"):
        read_lesson(path, pages=PAGES)
    config.unlink()
    config.write_text('{"num_hidden_layers": 2, "num_attention_heads": 4}')
    os.symlink(secret, tmp_path / "models" / "tiny" / "model.safetensors")    # so do the weights
    with pytest.raises(LessonError, match="model.safetensors is outside the lessons folder"):
        read_lesson(path, pages=PAGES)


# -- what a page shows of a user's words (dashboard.ui.plain, headprune.markdown.inert) ---------------------------

NASTY = ["<img src=x onerror=alert(1)>", "![x](http://127.0.0.2:9/x.png)", "[a](javascript:alert(1))",
         "- a list\n+ another\n1. ordered\n2) too\n---\n===\n0.8906 stays a number", "mail a@b.invalid",
         "**bold** _it_ `code` $x$ :red[red] :material/home: www.example.invalid http://127.0.0.2/",
         "# heading\n- item\n    indented\n> quote", "&lt;img&gt; &#60;b&#62;", "a\\*b \\<c"]


@pytest.mark.parametrize("text", NASTY)
def test_plain_text_shows_every_character_and_builds_no_markup(text):
    import html
    import re

    from headprune.markdown import inert

    out = inert(text)
    bare = re.sub(r"&#[0-9]+;", "", out)                  # what is left once the references are taken out
    assert not re.search(r"[\\`*_\[\]<>!&~$:|#@]|www\.", bare) and not re.search(r"^[-+=]|^[0-9]+[.)]( |$)", out,
                                                                               re.M), out
    # what Markdown shows for a numeric character reference is that character: the words come back, as written
    assert html.unescape(out) == "\n".join(line.lstrip(" \t") for line in text.split("\n"))


def test_lesson_markdown_keeps_emphasis_and_code_and_drops_what_could_fetch_or_run():
    import html

    from headprune.markdown import inert

    text = "Press **Apply**; `<bos>` stays; <img src=x> ![i](http://h/x.png) [l](javascript:x) www.h.invalid $x$"
    out = inert(text, markdown=True)
    assert "**Apply**" in out and "`<bos>`" in out
    outside = out.replace("`<bos>`", "")
    assert not any(c in outside for c in "<>[]:$") and "www." not in outside
    assert html.unescape(out) == text


# -- the controls a page has (headprune.controls) ------------------------------------------------------------------

def test_the_scan_finds_labels_through_helpers_fstrings_tabs_and_the_frame(tmp_path):
    from headprune.controls import page_controls

    (tmp_path / "pages").mkdir()
    (tmp_path / "ui.py").write_text('''
PAGES = (("1_A.py", "A page", "x", "prune"), ("2_B.py", "B page", "y", "roles"))
def page(title):
    sidebar()
def sidebar():
    st.sidebar.toggle("Roles on grids")
def long_job(key, label, run):
    slot.button(label, type="primary")
    cancel_button()
def cancel_button():
    st.button("Cancel")
''')
    (tmp_path / "pages" / "1_A.py").write_text('''
page("A page")
n = 3
st.button("Apply")
left.checkbox(f"Score the pruned model ({n} heads)")
long_job("k", "Compute scores", run)
st.tabs(["First tab", "Second tab"])
st.selectbox("Criterion", ["ae", "his"], index=0)
st.expander("Opened" if n else "Closed")
def local():
    st.radio(label="Edit", options=("prune", "keep"))
''')
    (tmp_path / "pages" / "2_B.py").write_text('st.button("Only here")\n')
    pages = page_controls(tmp_path)
    assert set(pages["prune"].labels) == {"Roles on grids", "Cancel", "Apply", "Score the pruned model (… heads)",
                                          "Compute scores", "First tab", "Second tab", "Criterion", "ae", "his",
                                          "Opened", "Closed", "Edit", "prune", "keep"}
    assert pages["prune"].has("score the pruned model (12 heads)") and not pages["prune"].has("Only here")
    assert pages["roles"].labels == ("Only here",)       # it never calls page(): no sidebar


def test_the_real_pages_have_the_controls_the_shipped_lessons_name():
    from headprune.controls import page_controls
    from headprune.lessons import named_controls

    pages = page_controls()
    lessons, errors = load_lessons([SHIPPED], pages=PAGE_NAMES)
    assert errors == []
    named = {(step.state.page, name) for lesson in lessons.values() for step in lesson.steps
             for text in step.words().values() for name in named_controls(text)}
    assert {("head-scores", "Compute scores"), ("prune", "Apply"), ("roles", "Find head roles")} <= named
    assert all(pages[page].has(name) for page, name in named)
    assert pages["prune"].has("Prune / restore") and not pages["prune"].has("Prune the lowest 50%")
