"""``lessons check``: a teacher's lesson files checked before class, with the Lessons page's own ``error:`` lines."""

from __future__ import annotations

import os
from pathlib import Path

from ..controls import dashboard_folder
from ..lessons import ENV, SHIPPED, LessonError, check_lessons, lesson_folders
from ..viewstate import PAGE_NAMES


def cmd_lessons(args) -> dict:
    paths = [Path(p) for p in args.paths] or lesson_folders(os.environ.get(ENV))
    lessons, errors, read = check_lessons(paths, pages=PAGE_NAMES)
    folder = dashboard_folder()
    if not read and not errors:
        errors.append(f"{', '.join(map(str, paths))}: no *.toml lesson files here; accepted: lesson files or "
                      "folders holding them.")
    if errors:
        bad = len({line.split(":", 1)[0] for line in errors})
        # one "error:" line per problem, as the Lessons page lists them (main prefixes the first)
        raise LessonError("\nerror: ".join([*errors, f"{len(errors)} problem(s) in {bad} file(s); {len(lessons)} "
                                                     f"of {read} lesson file(s) are usable."]))
    return {"checked": read, "paths": [str(p) for p in paths],
            "lessons": [{"name": lesson.name, "title": lesson.title, "minutes": lesson.minutes,
                         "steps": len(lesson.steps), "model": lesson.model, "file": str(lesson.path)}
                        for lesson in lessons.values()],
            "controls": f"the controls each step names were found in the page scripts of {folder}" if folder else
            "the controls each step names were not checked: the dashboard package is not installed",
            "summary": f"{len(lessons)} lesson(s) in {read} file(s), no errors"}


def add_commands(sub) -> None:
    p = sub.add_parser("lessons", help="check lesson files before class: every problem an error: FILE:LINE line "
                                       "(exit 2), as the dashboard's Lessons page shows it: raw HTML and links, "
                                       "controls a step names that its page lacks, measured numbers not filled "
                                       "from the live values")
    p.add_argument("action", choices=["check"], help="check: read every lesson as the Lessons page does")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=f"lesson files (.toml) or folders of them (default: the shipped lessons, {SHIPPED}, and "
                        f"the folder ${ENV} names if set)")
    p.set_defaults(handler=cmd_lessons)
