# headprune's dashboard for a classroom: one container, the three offline demos built in, no network at run time.
#   docker build -t headprune .
#   docker run -p 8501:8501 -e MALLOC_ARENA_MAX=2 headprune      # then open http://SERVER:8501/
# The build steps are container/build.sh, which CI runs directly (no docker daemon there), so what the image does is
# tested. torch is pinned (pyproject.toml) to the CPU build; pass PIP_INDEX_URL / PIP_EXTRA_INDEX_URL as build
# arguments if your registry serves the CPU wheel elsewhere.
FROM python:3.11-slim
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV HEADPRUNE_CACHE=/opt/headprune-cache \
    MALLOC_ARENA_MAX=2 \
    PYTHONUNBUFFERED=1 \
    STREAMLIT_SERVER_ADDRESS=0.0.0.0
WORKDIR /opt/headprune
COPY . .
RUN bash container/build.sh && rm -rf /root/.cache/pip
EXPOSE 8501
CMD ["python3", "-m", "headprune", "dashboard", "--port", "8501", "--headless"]
