"""Benchmark: publishing and downloading a model, ours against what a user would otherwise run.

Run by hand (never part of CI's pass/fail)::

    .venv/bin/python bench/publish_bench.py            # a 256 MB model
    .venv/bin/python bench/publish_bench.py --mb 1024

A model directory (``model.safetensors`` of random bytes, which compress as
weights do: barely, plus the small JSON files) is made in a temp dir, and the
stand-in Hub (``tests/support/hub.py``) serves on loopback in a process of its
own. Each case runs in a fresh interpreter and reports its own seconds and
peak RSS (``ru_maxrss``):

- upload, baseline: ``HfApi.upload_folder`` (what ``hf upload`` runs) with
  ``HF_HUB_DISABLE_XET=1`` — files by path, through LFS, as against any Hub
  without Xet;
- upload, ours: ``potato.publish.hub.upload`` — every file an open buffer,
  its bytes counted for the page's progress, through LFS;
- download, baseline: ``tar czf`` into a temporary file (gzip level 1), then
  sent from it in 1 MB reads — a copy of the model on disk first;
- download, ours: ``potato.publish.archive.stream_tar_gz`` — made while sent.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "hf_benchToken0123456789abcdefghijklmn"
HUB = """
import sys, time
from tests.support.hub import StandInHub, quiet_werkzeug
quiet_werkzeug()
hub = StandInHub({%r: ("bench", ())})
print(hub.start(), flush=True)
time.sleep(3600)
""" % TOKEN


def _model(directory: Path, mb: int) -> None:
    directory.mkdir()
    with open(directory / "model.safetensors", "wb") as out:
        for _ in range(mb):
            out.write(os.urandom(1024 * 1024))
    (directory / "config.json").write_text(json.dumps({"id2label": {"0": "positive", "1": "negative"}}))
    (directory / "tokenizer.json").write_text(json.dumps({"vocab": {f"w{i}": i for i in range(20000)}}))


def _files(directory: Path):
    from potato.publish.plan import OutFile

    return [OutFile(p.name, p.stat().st_size, source=p) for p in sorted(directory.iterdir())]


def case(name: str, directory: Path, endpoint: str) -> dict:
    started = time.perf_counter()
    extra: dict = {}
    if name == "upload-baseline":
        from huggingface_hub import HfApi

        api = HfApi(endpoint=endpoint, token=TOKEN)
        api.create_repo("bench/baseline", exist_ok=True)
        api.upload_folder(repo_id="bench/baseline", folder_path=directory)
    elif name == "upload-ours":
        from potato.publish.hub import Progress, upload

        files = _files(directory)
        progress = Progress(sum(f.size for f in files))
        upload(files, repo="bench/ours", revision="main", private=True, message="bench", description="",
               run_id=1, progress=progress, endpoint=endpoint)
        extra["bytes_counted"] = progress.done
    elif name == "download-baseline":
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "model.tar.gz"
            subprocess.run(["tar", "-C", str(directory.parent), "-czf", str(archive), directory.name],
                           env=dict(os.environ, GZIP="-1"), check=True)
            extra["temp_disk_mb"] = round(archive.stat().st_size / 1e6)
            with open(archive, "rb") as fh:
                while fh.read(1024 * 1024):
                    pass
    elif name == "download-ours":
        from potato.publish.archive import stream_tar_gz

        extra["sent_mb"] = round(sum(len(c) for c in stream_tar_gz(_files(directory), "model")) / 1e6)
    seconds = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # tar's, for the baseline
    return {"case": name, "seconds": round(seconds, 2),
            "peak_rss_mb": round(max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, children) / 1024), **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--case")
    parser.add_argument("--dir")
    parser.add_argument("--endpoint")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(case(args.case, Path(args.dir), args.endpoint)))
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_DISABLE_XET="1", HF_TOKEN=TOKEN, HF_HUB_DISABLE_PROGRESS_BARS="1")
    env.pop("HF_HUB_OFFLINE", None)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "model"
        _model(directory, args.mb)
        hub = subprocess.Popen([sys.executable, "-c", HUB], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        try:
            endpoint = hub.stdout.readline().strip()
            results = []
            for name in ("upload-baseline", "upload-ours", "download-baseline", "download-ours"):
                done = subprocess.run([sys.executable, __file__, "--case", name, "--dir", str(directory),
                                       "--endpoint", endpoint], env=env, cwd=ROOT, capture_output=True, text=True)
                if done.returncode:
                    sys.exit(done.stderr)
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            hub.kill()
    print(f"model: {args.mb} MB; load: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for r in results:
        print(json.dumps(r))
    by = {r["case"]: r for r in results}
    for what in ("upload", "download"):
        base, ours = by[f"{what}-baseline"], by[f"{what}-ours"]
        print(f"{what}: ours {ours['seconds']} s / baseline {base['seconds']} s = {ours['seconds'] / base['seconds']:.2f}x; "
              f"peak RSS ours {ours['peak_rss_mb']} MB, baseline {base['peak_rss_mb']} MB")


if __name__ == "__main__":
    main()
