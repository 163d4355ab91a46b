"""A stand-in for the Hugging Face Hub's HTTP API, on loopback: no Hub is reachable from these machines.

It serves what the real ``huggingface_hub`` client calls to publish a model
and to read it back, checked against huggingface_hub 2.5.0 (its ``hf_api.py``,
``_commit_api.py``, ``lfs.py``, ``file_download.py`` and
``_snapshot_download.py``):

- ``GET /api/whoami-v2`` — who a token is (user, organisations);
- ``GET /api/agent-harnesses`` — the client's telemetry registry (answered empty);
- ``GET /api/organizations/{org}/overview`` — 404 (no organisation publishes
  kernels here): what transformers' ``kernels`` asks before it would fetch a
  layer's kernel from ``kernels-community`` while a model from here loads;
- ``POST /api/repos/create`` — 409 when the repo exists, 403 in a namespace
  the token's user cannot write (another user's, an organisation it is not
  in); a new repo's first commit holds ``.gitattributes``, as the Hub's does;
- ``GET /api/models/{repo}[/revision/{rev}]`` — the repo's info (``sha``,
  ``private``, ``siblings``); ``GET /api/models/{repo}/tree/{rev}`` — its files
  (``recursive``), LFS files with their ``lfs`` block;
- ``POST /api/models/{repo}/branch/{branch}`` — a branch from ``main``;
- ``POST /api/validate-yaml`` — a README's front matter must be a YAML mapping;
- ``POST /api/models/{repo}/preupload/{rev}`` — the pre-upload check: LFS
  for files the repo's ``.gitattributes`` sends to LFS, binary samples and
  files of 10 MB or more, else inline (``regular``);
- ``POST /{repo}.git/info/lfs/objects/batch`` — the LFS batch API (basic
  transfer): an upload action per object it does not hold yet, none for one
  it holds, so a publish that is repeated sends only what is missing;
  ``PUT /lfs-upload/{repo}/{oid}`` on the storage host takes the bytes and
  checks their sha256 and size (objects belong to a repo, as on the Hub);
- ``POST /api/models/{repo}/commit/{rev}`` — the ndjson commit: a header,
  ``file`` lines (base64, inline), ``lfsFile`` lines (an object uploaded
  before) and ``deletedFile`` lines; answers ``commitOid`` and ``commitUrl``;
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` — a download: an inline file
  directly, an LFS file as a 302 to the storage host's ``/lfs-files/{repo}/{oid}`` with
  ``X-Linked-Etag``/``X-Linked-Size``, both with ``X-Repo-Commit``.

Tokens are ``Authorization: Bearer …``; an unknown token gets 401 ``Invalid
credentials in Authorization header``, as the Hub answers. A private repo is
404 (``X-Error-Code: RepoNotFound``) to anyone but its owner.

Xet: huggingface_hub 2.5.0 no longer asks the server whether to use Xet — it
uploads through Xet whenever ``hf_xet`` is installed, unless a file comes as
a buffer (``io.BufferedIOBase``), which goes through LFS. Potato's publisher
hands every file over as a buffer (``potato/publish/hub.py``), so this
stand-in implements no Xet endpoint and advertises none (no ``X-Xet-*``
header on a download), and the client then downloads over plain HTTP.

Every request is recorded (``requests``); one to a path the stand-in does not
know is answered 404 and listed in ``unknown``, and ``check()`` fails on it:
a new client version that calls something new fails the tests that use this.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field

import yaml
from flask import Flask, Response, abort, jsonify, request
from werkzeug.serving import make_server

CHECKED_WITH = "huggingface_hub 2.5.0"
GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in (
    "*.bin", "*.ckpt", "*.h5", "*.npy", "*.onnx", "*.pt", "*.pth", "*.safetensors", "*.tar.*", "*.zip"))
LFS_MIN_BYTES = 10 * 1024 * 1024


def git_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Blob:
    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass
class Repo:
    owner: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)        # branch -> commit id
    commits: dict[str, dict[str, Blob]] = field(default_factory=dict)  # commit id -> path -> blob
    messages: dict[str, str] = field(default_factory=dict)

    def files(self, rev: str) -> dict[str, Blob] | None:
        commit = self.branches.get(rev, rev)
        return self.commits.get(commit)

    def commit(self, branch: str, files: dict[str, Blob], message: str) -> str:
        oid = hashlib.sha1(f"{branch}{len(self.commits)}{time.time_ns()}{message}".encode()).hexdigest()
        self.commits[oid] = files
        self.messages[oid] = message
        self.branches[branch] = oid
        return oid


class StandInHub:
    """The stand-in Hub: ``start()`` returns its URL; ``users`` maps token -> (user name, organisations)."""

    def __init__(self, users: dict[str, tuple[str, tuple[str, ...]]]):
        self.users = users
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, dict[str, bytes]] = {}  # repo -> sha256 -> the bytes of an uploaded LFS object
        self.requests: list[tuple[str, str, int]] = []
        self.unknown: list[str] = []
        self.lock = threading.RLock()
        self.app = self._make_app()
        self._servers: list = []
        self.url = ""
        # Where LFS bytes go up and come down: another origin, as the Hub's storage is (a test may put a
        # proxy in front of it). The client does not follow a redirect to another origin with its token.
        self.storage_url = ""

    # -- running -----------------------------------------------------------------

    def start(self) -> str:
        """Serve the API and the storage host, each on a free loopback port; return the API's URL."""
        for name in ("url", "storage_url"):
            server = make_server("127.0.0.1", 0, self.app, threaded=True)
            threading.Thread(target=server.serve_forever, daemon=True, name=f"stand-in-hub-{name}").start()
            self._servers.append(server)
            setattr(self, name, f"http://127.0.0.1:{server.port}")
        return self.url

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()

    def check(self) -> None:
        assert not self.unknown, f"the client called endpoints the stand-in Hub does not know: {self.unknown}"

    def calls(self, method: str, contains: str = "") -> int:
        return sum(1 for m, path, _ in self.requests if m == method and contains in path)

    def make_repo(self, repo_id: str, owner: str, *, private: bool = False, files: dict[str, bytes] | None = None) -> None:
        """A repo someone made beforehand (someone else's, for a 403)."""
        repo = Repo(owner=owner, private=private)
        blobs = {".gitattributes": Blob(GITATTRIBUTES.encode(), False)}
        blobs.update({p: Blob(c, False) for p, c in (files or {}).items()})
        repo.commit("main", blobs, "initial commit")
        self.repos[repo_id] = repo

    # -- the API -----------------------------------------------------------------

    def _make_app(self) -> Flask:
        app = Flask("stand-in-hub")
        hub = self

        def error(status: int, message: str, code: str | None = None):
            response = jsonify({"error": message})
            response.status_code = status
            response.headers["X-Error-Message"] = message
            if code:
                response.headers["X-Error-Code"] = code
            return response

        def caller() -> str | None:
            """The token's user; aborts 401 for a token the Hub does not know (None: no token)."""
            header = request.headers.get("Authorization", "")
            if not header.startswith("Bearer "):
                return None
            known = hub.users.get(header[len("Bearer "):])
            if known is None:
                abort(error(401, "Invalid credentials in Authorization header"))
            return known[0]

        def may_write(namespace: str, user: str | None) -> bool:
            return user is not None and (namespace == user or namespace in dict(hub.users.values())[user])

        def repo_for(namespace: str, name: str, *, write: bool = False) -> Repo:
            user = caller()
            repo = hub.repos.get(f"{namespace}/{name}")
            if repo is None or (repo.private and not may_write(repo.owner, user)):
                abort(error(404, "Repository not found", "RepoNotFound"))
            if write and not may_write(repo.owner, user):
                abort(error(403, f"You don't have the rights to write to {namespace}/{name}"))
            return repo

        def files_at(repo: Repo, rev: str) -> dict[str, Blob]:
            files = repo.files(rev)
            if files is None:
                abort(error(404, f"Invalid rev id: {rev}", "RevisionNotFound"))
            return files

        @app.after_request
        def remember(response):
            with hub.lock:
                hub.requests.append((request.method, request.path, response.status_code))
            return response

        @app.errorhandler(404)
        def unknown(exc):
            if request.url_rule is None:  # no route at all, not a 404 a route gave
                hub.unknown.append(f"{request.method} {request.path}")
            return error(404, "Not found")

        @app.get("/api/whoami-v2")
        def whoami():
            user = caller()
            if user is None:
                return error(401, "Invalid credentials in Authorization header")
            orgs = dict(hub.users.values())[user]
            return jsonify({"type": "user", "name": user, "fullname": user, "orgs": [{"name": o, "type": "org"} for o in orgs],
                            "auth": {"type": "access_token", "accessToken": {"displayName": "potato-tests", "role": "write"}}})

        @app.get("/api/agent-harnesses")
        def agent_harnesses():  # the client's telemetry asks once a day which AI agents to recognise: none
            return jsonify({"standardEnvVars": [], "harnesses": {}})

        @app.get("/api/organizations/<org>/overview")
        def organization_overview(org):  # transformers' hub kernels check a kernel publisher: none here
            return error(404, f"Organization {org} not found")

        @app.post("/api/repos/create")
        def create_repo():
            user = caller()
            if user is None:
                return error(401, "Invalid credentials in Authorization header")
            body = request.get_json()
            namespace = body.get("organization") or user
            repo_id = f"{namespace}/{body['name']}"
            if not may_write(namespace, user):
                return error(403, f"You don't have the rights to create a model under the namespace \"{namespace}\"")
            with hub.lock:
                if repo_id in hub.repos:  # the Hub's 409 carries the url too (create_repo(exist_ok=True) reads it)
                    response = error(409, "You already created this model repo")
                    response.set_data(json.dumps({"error": "You already created this model repo",
                                                  "url": f"{request.host_url}{repo_id}"}))
                    return response
                hub.make_repo(repo_id, namespace, private=body.get("visibility", "public") == "private"
                              or bool(body.get("private")))
            return jsonify({"url": f"{request.host_url}{repo_id}", "name": repo_id, "id": repo_id})

        def info(namespace: str, name: str, rev: str):
            repo = repo_for(namespace, name)
            files = files_at(repo, rev)
            return jsonify({"id": f"{namespace}/{name}", "modelId": f"{namespace}/{name}", "author": namespace,
                            "sha": repo.branches.get(rev, rev), "private": repo.private, "disabled": False,
                            "gated": False, "tags": [], "downloads": 0, "likes": 0,
                            "siblings": [{"rfilename": p} for p in sorted(files)]})

        app.get("/api/models/<namespace>/<name>")(lambda namespace, name: info(namespace, name, "main"))
        app.add_url_rule("/api/models/<namespace>/<name>/revision/<path:rev>", "info_at", info)

        @app.get("/api/models/<namespace>/<name>/tree/<rev>")
        @app.get("/api/models/<namespace>/<name>/tree/<rev>/<path:under>")
        def tree(namespace, name, rev, under=""):
            files = files_at(repo_for(namespace, name), rev)
            prefix = f"{under.rstrip('/')}/" if under else ""
            deep = request.args.get("recursive", "false").lower() in ("1", "true")
            entries, folders = [], set()
            for path, blob in sorted(files.items()):
                if not path.startswith(prefix):
                    continue
                rest = path[len(prefix):]
                if "/" in rest and not deep:
                    folders.add(prefix + rest.split("/")[0])
                    continue
                if deep:
                    parts = rest.split("/")[:-1]
                    folders.update(prefix + "/".join(parts[:i + 1]) for i in range(len(parts)))
                entry = {"type": "file", "oid": git_oid(blob.content), "size": len(blob.content), "path": path}
                if blob.lfs:
                    entry["lfs"] = {"oid": blob.sha256, "size": len(blob.content), "pointerSize": 134}
                entries.append(entry)
            entries += [{"type": "directory", "oid": git_oid(f.encode()), "size": 0, "path": f} for f in sorted(folders)]
            return jsonify(entries)

        @app.post("/api/models/<namespace>/<name>/branch/<path:branch>")
        def create_branch(namespace, name, branch):
            repo = repo_for(namespace, name, write=True)
            with hub.lock:
                if branch in repo.branches:
                    return error(409, f"Reference already exists: refs/heads/{branch}")
                repo.branches[branch] = repo.branches["main"]
            return jsonify({})

        @app.post("/api/validate-yaml")
        def validate_yaml():
            content = request.get_json()["content"]
            if content.startswith("---\n"):
                meta = yaml.safe_load(content[4:content.index("\n---\n", 4)])
                if not isinstance(meta, dict):
                    return jsonify({"errors": [{"message": "metadata must be a YAML mapping"}]}), 400
            return jsonify({"warnings": [], "errors": []})

        @app.post("/api/models/<namespace>/<name>/preupload/<rev>")
        def preupload(namespace, name, rev):
            repo = repo_for(namespace, name, write=True)
            files = files_at(repo, rev)
            lfs_patterns = [line.split()[0] for line in files[".gitattributes"].content.decode().splitlines()
                            if "filter=lfs" in line] if ".gitattributes" in files else []
            answer = []
            for f in request.get_json()["files"]:
                sample = base64.b64decode(f["sample"])
                lfs = (f["size"] >= LFS_MIN_BYTES or b"\0" in sample
                       or any(fnmatch.fnmatch(f["path"].rsplit("/", 1)[-1], p) for p in lfs_patterns))
                entry = {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
                old = files.get(f["path"])
                if old is not None:
                    entry["oid"] = old.sha256 if old.lfs else git_oid(old.content)
                answer.append(entry)
            return jsonify({"files": answer, "commitOid": repo.branches.get(rev, rev)})

        @app.post("/<namespace>/<name>.git/info/lfs/objects/batch")
        def lfs_batch(namespace, name):
            repo_for(namespace, name, write=True)
            body = request.get_json()
            held = hub.lfs.get(f"{namespace}/{name}", {})  # LFS objects belong to a repo, as on the Hub
            objects = []
            for obj in body["objects"]:
                entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
                if obj["oid"] not in held:
                    entry["actions"] = {"upload": {"href": f"{hub.storage_url}/lfs-upload/{namespace}/{name}/"
                                                           f"{obj['oid']}?size={obj['size']}", "header": {}}}
                objects.append(entry)
            response = jsonify({"transfer": "basic", "objects": objects})
            response.headers["Content-Type"] = "application/vnd.git-lfs+json"
            return response

        @app.put("/lfs-upload/<namespace>/<name>/<oid>")
        def lfs_upload(namespace, name, oid):
            data = request.get_data()
            if hashlib.sha256(data).hexdigest() != oid or len(data) != int(request.args["size"]):
                return error(400, "The uploaded content does not match its oid and size")
            with hub.lock:
                hub.lfs.setdefault(f"{namespace}/{name}", {})[oid] = data
            return Response(status=200)

        @app.post("/api/models/<namespace>/<name>/commit/<rev>")
        def commit(namespace, name, rev):
            repo = repo_for(namespace, name, write=True)
            lines = [json.loads(line) for line in request.get_data().splitlines() if line.strip()]
            with hub.lock:
                files = dict(files_at(repo, rev))
                message = ""
                for line in lines:
                    key, value = line["key"], line["value"]
                    if key == "header":
                        message = value["summary"]
                    elif key == "file":
                        files[value["path"]] = Blob(base64.b64decode(value["content"]), False)
                    elif key == "lfsFile":
                        held = hub.lfs.get(f"{namespace}/{name}", {})
                        if value["oid"] not in held:
                            return error(400, f"LFS object {value['oid']} was never uploaded")
                        files[value["path"]] = Blob(held[value["oid"]], True)
                    elif key == "deletedFile":
                        if files.pop(value["path"], None) is None:
                            return error(404, "A file with this name doesn't exist", "EntryNotFound")
                    else:
                        return error(400, f"The stand-in Hub does not take commit lines of kind {key!r}")
                oid = repo.commit(rev, files, message)
            return jsonify({"success": True, "commitOid": oid, "commitUrl": f"{request.host_url}{namespace}/{name}/commit/{oid}",
                            "hookOutput": ""})

        def _resolve(namespace, name, rev, path):
            repo = repo_for(namespace, name)
            blob = files_at(repo, rev).get(path)
            if blob is None:
                return error(404, "Entry not found", "EntryNotFound")
            headers = {"X-Repo-Commit": repo.branches.get(rev, rev)}
            if blob.lfs:
                headers.update({"Location": f"{hub.storage_url}/lfs-files/{namespace}/{name}/{blob.sha256}",
                                "X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(len(blob.content)),
                                "ETag": f'"{git_oid(blob.content)}"'})
                return Response(status=302, headers=headers)
            headers["ETag"] = f'"{git_oid(blob.content)}"'
            # Werkzeug drops a HEAD answer's body but keeps its Content-Length: the client's size.
            return Response(blob.content, headers=headers, content_type="application/octet-stream")

        app.add_url_rule("/<namespace>/<name>/resolve/<rev>/<path:path>", "resolve", _resolve, methods=["GET", "HEAD"])

        @app.get("/lfs-files/<namespace>/<name>/<oid>")
        def lfs_file(namespace, name, oid):
            data = hub.lfs.get(f"{namespace}/{name}", {}).get(oid)
            if data is None:
                return error(404, "No such object")
            return Response(data, content_type="application/octet-stream")

        return app

    def read(self, repo_id: str, path: str, rev: str = "main") -> bytes:
        return self.repos[repo_id].files(rev)[path].content

    def paths(self, repo_id: str, rev: str = "main") -> list[str]:
        return sorted(self.repos[repo_id].files(rev))

    def message(self, repo_id: str, rev: str = "main") -> str:
        repo = self.repos[repo_id]
        return repo.messages[repo.branches[rev]]

    def is_lfs(self, repo_id: str, path: str, rev: str = "main") -> bool:
        return self.repos[repo_id].files(rev)[path].lfs

    def __repr__(self) -> str:  # pragma: no cover - for a failing assertion's message
        return f"StandInHub(repos={sorted(self.repos)}, unknown={self.unknown})"


def quiet_werkzeug() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)


def bad_gateway() -> tuple[object, int]:
    """A "Hub" that answers every request 502 with an empty body, as a proxy in front of a Hub that is down
    does; (its server, to ``shutdown()``, and its port on loopback)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class BadGateway(BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(502)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_HEAD = do_PUT = _answer

        def log_message(self, *args):
            pass

    gateway = ThreadingHTTPServer(("127.0.0.1", 0), BadGateway)
    threading.Thread(target=gateway.serve_forever, daemon=True, name="bad-gateway").start()
    return gateway, gateway.server_port
