"""Lessons: short guided tours, each step a dashboard state with a few sentences, a question and its reveal."""

import streamlit as st

from dashboard.compute import available_lessons
from dashboard.ui import PAGE_URLS, page, plain, step_anchor
from headprune.lessons import ENV, SHIPPED

ws, sd = page("Lessons", "Each lesson is a few steps; a step opens a page in a given state (heads pruned, a head "
                         "selected, a sentence) with a question. Share a step's link with a class.")
lessons, errors = available_lessons(list(PAGE_URLS.values()))

# a lesson is a file people share: every word of it is shown inert (ui.plain), whatever the file holds
for lesson in lessons.values():
    with st.container(border=True, key=f"lesson-{lesson.name}"):
        st.subheader(plain(lesson.title), anchor=False)
        model = plain(lesson.model) if lesson.linkable else "a folder"
        st.caption(f"about {lesson.minutes} minutes · model **{model}** · data **{plain(lesson.data)}** · "
                   f"{len(lesson.steps)} steps · file {plain(lesson.path.name)}")
        st.markdown(plain(lesson.summary, markdown=True))
        st.markdown("\n".join(f"{k}. {step_anchor(lesson, k, step.title)}" for k, step in enumerate(lesson.steps, 1)),
                    unsafe_allow_html=True)

if errors:
    st.subheader("Lessons that could not be used")
    st.code("\n".join(f"error: {line}" for line in errors), language=None)
st.caption(f"Shipped lessons: {plain(SHIPPED)}. A teacher's own lessons: set {ENV} to a folder of .toml files before "
           "starting the dashboard (the format: docs/tutorials/lessons.md; `python -m headprune lessons check FOLDER` "
           "checks them first).")
