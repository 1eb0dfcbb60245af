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
    assert errors == [f"{big}:1: the file is {big.stat().st_size:,} bytes; a lesson is at most {MAX_BYTES:,} bytes "
                      "(a few pages of text)."]


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
