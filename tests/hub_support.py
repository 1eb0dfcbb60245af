"""A local fake of the Hugging Face hub for the online tests of ``headprune.protocol.smoke``: a threaded HTTP server
on 127.0.0.1 that answers exactly what ``AutoConfig.from_pretrained(repo)`` and ``datasets.load_dataset_builder(repo,
config)`` ask for (found by logging their requests with huggingface_hub 2.4 / datasets 5.2), and records every
request, so a test can assert that no weights and no data rows were read.

What the clients ask, and what is answered:

    models    HEAD/GET /{repo}/resolve/{rev}/config.json -> the config (X-Repo-Commit, ETag, Content-Length);
              GET /api/models/{repo} -> the repo's info (transformers asks once); any other file -> 404 EntryNotFound
    datasets  HEAD/GET /datasets/{repo}/resolve/{rev}/README.md -> the dataset card, whose YAML states the configs'
              data files and features (``dataset_info``) as the hub's cards do; GET /api/datasets/{repo}[/revision/
              {rev}] -> the repo's info; GET /api/datasets/{repo}/tree/{rev}[/{dir}] -> the file listing (the data
              files are listed, never served: a builder's info needs none of them)
    else      404 (RepoNotFound for an unknown repo), e.g. /api/agent-harnesses, .huggingface.yaml, glue.py

``hub_clients_at(hub, tmp, monkeypatch)`` points huggingface_hub, transformers and datasets at the server and at a
fresh cache under ``tmp``: they read their endpoint, offline flag and cache paths once, at import, so the module
constants are patched (and restored by monkeypatch) besides the environment.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SHA = "0123456789abcdef0123456789abcdef01234567"   # every repo's one commit


def bert_config(id2label: dict[int, str]) -> dict:
    """A tiny BERT sequence classifier's config.json with these labels (as a fine-tune's on the hub)."""
    return {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "hidden_size": 32,
            "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 37, "vocab_size": 99,
            "max_position_embeddings": 64, "type_vocab_size": 2,
            "id2label": {str(k): v for k, v in id2label.items()},
            "label2id": {v: k for k, v in id2label.items()}}


@dataclass
class DataConfig:
    """One config of a hub data set: its string columns, its label column and ClassLabel names (or, without names,
    the label's dtype: string, int64, float32), its splits, and columns of string lists (a choice's endings)."""

    texts: tuple
    label: str
    names: list | None
    splits: tuple
    label_dtype: str = "string"
    sequences: tuple = ()


def dataset_card(configs: dict[str, DataConfig]) -> str:
    """README.md with the YAML header the hub's dataset cards carry (``configs`` with data files per split,
    ``dataset_info`` with features and splits), written by hand in the cards' layout."""
    lines = ["---", "configs:"]
    for name, c in configs.items():
        lines += [f"- config_name: {name}", "  data_files:"]
        for split in c.splits:
            lines += [f"  - split: {split}", f"    path: {name}/{split}-*"]
    lines.append("dataset_info:")
    for name, c in configs.items():
        lines += [f"- config_name: {name}", "  features:"]
        for col in c.texts:
            lines += [f"  - name: {col}", "    dtype: string"]
        for col in c.sequences:
            lines += [f"  - name: {col}", "    sequence: string"]
        if c.names is None:
            lines += [f"  - name: {c.label}", f"    dtype: {c.label_dtype}"]
        else:
            lines += [f"  - name: {c.label}", "    dtype:", "      class_label:", "        names:"]
            lines += [f"          '{i}': {n}" for i, n in enumerate(c.names)]
        lines += ["  - name: idx", "    dtype: int32", "  splits:"]
        for split in c.splits:
            lines += [f"  - name: {split}", "    num_bytes: 1000", "    num_examples: 100"]
    return "\n".join(lines + ["---", "", "# a data set served by the fake hub", ""])


@dataclass
class FakeHub:
    """The server's content (models: repo -> config.json dict; datasets: repo -> {config: DataConfig}) and the
    requests it saw (method, path)."""

    models: dict = field(default_factory=dict)
    datasets: dict = field(default_factory=dict)
    requests: list = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def paths(self) -> list[str]:
        return [p for _, p in self.requests]

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, as the hub clients expect

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.requests.append(("HEAD", self.path))
                self._answer(*hub.route(self.path))

            def do_GET(self):
                hub.requests.append(("GET", self.path))
                self._answer(*hub.route(self.path))

            def _answer(self, status: int, body: bytes, headers: dict):
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- routes ------------------------------------------------------------------------------------------------------

    def route(self, path: str) -> tuple[int, bytes, dict]:
        path = path.split("?", 1)[0]
        if path.startswith("/api/models/"):
            repo = self._repo(path[len("/api/models/"):], self.models)
            return self._info(repo, ["config.json"]) if repo else self._missing("RepoNotFound")
        if path.startswith("/api/datasets/"):
            rest = path[len("/api/datasets/"):]
            repo = self._repo(rest, self.datasets)
            if repo is None:
                return self._missing("RepoNotFound")
            tail = rest[len(repo):].strip("/")
            if tail.startswith("tree/"):
                return self._tree(repo, tail[len("tree/"):].partition("/")[2])
            return self._info(repo, ["README.md"] + self._data_files(repo))
        if path.startswith("/datasets/"):
            return self._file(path[len("/datasets/"):], self.datasets,
                              lambda repo: {"README.md": dataset_card(self.datasets[repo]).encode()})
        return self._file(path.lstrip("/"), self.models,
                          lambda repo: {"config.json": json.dumps(self.models[repo], indent=2).encode()})

    @staticmethod
    def _repo(rest: str, repos: dict) -> str | None:
        return next((r for r in repos if rest == r or rest.startswith(r + "/")), None)

    @staticmethod
    def _missing(code: str) -> tuple[int, bytes, dict]:
        return 404, json.dumps({"error": code}).encode(), {"X-Error-Code": code, "Content-Type": "application/json"}

    def _file(self, rest: str, repos: dict, files) -> tuple[int, bytes, dict]:
        """/{repo}/resolve/{rev}/{filename}: the file with the headers hf_hub_download needs (commit, ETag, size)."""
        repo = self._repo(rest, repos)
        if repo is None or "/resolve/" not in rest:
            return self._missing("RepoNotFound")
        filename = rest[len(repo) + len("/resolve/"):].partition("/")[2]
        body = files(repo).get(filename)
        if body is None:
            status, text, headers = self._missing("EntryNotFound")
            return status, text, {**headers, "X-Repo-Commit": SHA}
        return 200, body, {"X-Repo-Commit": SHA, "ETag": f'"{hashlib.sha256(body).hexdigest()}"',
                           "Content-Type": "application/octet-stream"}

    def _data_files(self, repo: str) -> list[str]:
        return [f"{name}/{split}-00000-of-00001.parquet" for name, c in self.datasets[repo].items()
                for split in c.splits]

    def _info(self, repo: str, files: list[str]) -> tuple[int, bytes, dict]:
        info = {"id": repo, "_id": repo, "sha": SHA, "private": False, "gated": False, "disabled": False,
                "downloads": 0, "likes": 0, "tags": [], "lastModified": "2024-01-01T00:00:00.000Z",
                "createdAt": "2024-01-01T00:00:00.000Z", "siblings": [{"rfilename": f} for f in files]}
        return 200, json.dumps(info).encode(), {"Content-Type": "application/json"}

    def _tree(self, repo: str, folder: str) -> tuple[int, bytes, dict]:
        """The listing of ``folder`` (not recursive, as HfFileSystem's glob asks): files and sub-folders."""
        entries, folders = [], set()
        for path in ["README.md"] + self._data_files(repo):
            parent, _, name = path.rpartition("/")
            if parent == folder:
                entries.append({"type": "file", "path": path, "size": 1000, "oid": hashlib.sha1(path.encode())
                                .hexdigest()})
            elif not folder and parent:
                folders.add(parent.split("/")[0])
        entries += [{"type": "directory", "path": f, "oid": hashlib.sha1(f.encode()).hexdigest()}
                    for f in sorted(folders)]
        return 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}


def hub_clients_at(hub: FakeHub, tmp: Path, monkeypatch) -> None:
    """Point huggingface_hub, transformers and datasets at ``hub`` with the network on and a fresh cache under
    ``tmp`` (module doc): the environment for anything that reads it later, and the constants read at import."""
    import datasets.config
    import huggingface_hub.constants as hub_constants

    home = tmp / "hf_home"
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("HF_HOME", str(home))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(hub_constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(hub_constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", hub.endpoint)
    monkeypatch.setattr(datasets.config, "HUB_DATASETS_URL",
                        hub.endpoint + "/datasets/{repo_id}/resolve/{revision}/{path}")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    # every cache path derived from HF_HOME at import (the hub cache, datasets' cache and modules, the agent
    # registry file): under tmp, so nothing of this machine's cache is read or written
    for module, root in ((hub_constants, hub_constants.HF_HOME), (datasets.config, datasets.config.HF_CACHE_HOME)):
        for name, value in list(vars(module).items()):
            if name.isupper() and isinstance(value, (str, Path)) and str(value).startswith(str(root)):
                moved = str(home) + str(value)[len(str(root)):]
                monkeypatch.setattr(module, name, type(value)(moved))
