"""The predictions upload: streamed into the run directory, counted, and checked line by line as it comes.

The file becomes the run's ``predictions.jsonl`` only when all of it has
arrived and every line is a prediction (``bodies.check_prediction_line``):
a body that is too large, cut short or holds one bad line is refused whole,
and leaves neither the file nor its temporary copy behind. The temporary
name is unique per upload and nobody can guess it, so two uploads at once never write
into one file (``potato.training.atomic_files``).
"""

from __future__ import annotations

from typing import BinaryIO

from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from potato.protocol.bodies import BadField, check_prediction_line
from potato.protocol.jsonapi import ApiError
from potato.runs.paths import RunPaths
from potato.training import atomic_files

UPLOAD_CHUNK = 256 * 1024
MAX_LINE_BYTES = 1024 * 1024  # a prediction is about 100 bytes; a line this long is not one


def too_large(limit_mb: int, size: int | None = None) -> ApiError:
    got = f" ({size / 1048576:.1f} MB)" if size is not None else ""
    return ApiError(413, f"predictions.jsonl is larger than model_training.max_predictions_mb "
                    f"({limit_mb} MB){got}; raise the limit in the config or predict fewer items",
                    max_predictions_mb=limit_mb)


class _Lines:
    """Splits a byte stream into lines and checks each complete one."""

    def __init__(self) -> None:
        self.partial = b""
        self.count = 0

    def feed(self, chunk: bytes) -> None:
        *complete, self.partial = (self.partial + chunk).split(b"\n")
        for line in complete:
            self._check(line)
        if len(self.partial) > MAX_LINE_BYTES:
            raise BadField(f"predictions.jsonl line {self.count + 1} is longer than {MAX_LINE_BYTES} bytes; "
                           "each line is one prediction")

    def close(self) -> None:
        self._check(self.partial)  # a last line without its newline
        self.partial = b""

    def _check(self, line: bytes) -> None:
        if line.strip():
            self.count += 1
            check_prediction_line(line, self.count)


def receive(stream: BinaryIO, paths: RunPaths, *, limit_mb: int, expected: int | None) -> tuple[int, int]:
    """Stream *stream* into the run's ``predictions.jsonl``; return (bytes, predictions). Raises ``ApiError`` (400, 413).

    *expected* is the request's Content-Length (None when chunked): a body
    that ends short of it is refused.
    """
    limit = limit_mb * 1024 * 1024
    total = 0
    lines = _Lines()
    try:
        with atomic_files.Replacement(paths.dir, paths.predictions.name, prefix=paths.partial_upload_prefix()) as out:
            while True:
                try:
                    chunk = stream.read(UPLOAD_CHUNK)
                except RequestEntityTooLarge:  # Werkzeug's own count of the same limit
                    raise too_large(limit_mb) from None
                except ClientDisconnected:  # the body ended before its Content-Length
                    chunk = b""
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:  # no or a false Content-Length: counted while streaming
                    raise too_large(limit_mb)
                lines.feed(chunk)
                out.write(chunk)
            if expected is not None and total != expected:  # cut short: its last line is no prediction's fault
                raise ApiError(400, f"The upload ended after {total} of {expected} bytes; send it again")
            lines.close()
            out.commit()
    except BadField as exc:
        raise ApiError(400, f"{exc}; the upload was not kept: fix the worker's predictions and send them again") \
            from None
    return total, lines.count
