"""Lessons: short guided tours, each step a dashboard state with a few sentences, a question and its reveal."""

import streamlit as st

from dashboard.compute import available_lessons
from dashboard.ui import PAGE_URLS, page, step_href
from headprune.lessons import ENV, SHIPPED

ws, sd = page("Lessons", "Each lesson is a few steps; a step opens a page in a given state (heads pruned, a head "
                         "selected, a sentence) with a question. Share a step's link with a class.")
lessons, errors = available_lessons(list(PAGE_URLS.values()))

for lesson in lessons.values():
    with st.container(border=True, key=f"lesson-{lesson.name}"):
        st.markdown(f"### {lesson.title}")
        st.caption(f"about {lesson.minutes} minutes · model **{lesson.model if lesson.linkable else 'a folder'}** · "
                   f"data **{lesson.data}** · {len(lesson.steps)} steps · `{lesson.path.name}`")
        st.markdown(lesson.summary)
        st.markdown("\n".join(f'{k}. <a href="{step_href(lesson, k)}" target="_self">{step.title}</a>'
                              for k, step in enumerate(lesson.steps, start=1)), unsafe_allow_html=True)

if errors:
    st.subheader("Lessons that could not be used")
    st.code("\n".join(f"error: {line}" for line in errors), language=None)
st.caption(f"Shipped lessons: `{SHIPPED}`. A teacher's own lessons: set {ENV} to a folder of .toml files before "
           "starting the dashboard (the format: docs/tutorials/lessons.md).")
