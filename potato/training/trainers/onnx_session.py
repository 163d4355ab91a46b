"""An ONNX Runtime session in a process of its own: ``python -m potato.training.trainers.onnx_session MODEL THREADS``.

The worker that trains a model holds what training leaves behind — torch,
transformers and the model's code (300 MB on a MiniLM), the model itself and
the heap of its training step — and a session in that process would add its
own copy of the weights and its buffers on top (140 MB more for a MiniLM).
Here the session runs in a fresh interpreter that imports only onnxruntime
and numpy, so the prediction pass's memory is the session's and little else:
the worker tokenizes each batch and sends its token ids and mask down a pipe,
and reads the logits back (:class:`SessionProcess`).

The pipe carries frames, little-endian: a request is ``rows, tokens`` (two
uint32) and then the ids and the mask, int64 each, row by row; an answer is
``rows, outputs`` and the logits, float32. The child starts by answering
``READY`` (``0, 0``) once its session is made. Anything that goes wrong in
the child becomes an answer of ``FAILED`` rows followed by a uint32 length
and the message in UTF-8, and the child exits; it also exits when its stdin
closes (the worker ended, whatever way).

Part of the remote half: importing this module loads only the standard
library; numpy comes with the worker's torch, onnxruntime is imported in the child.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from typing import Any, BinaryIO, List, Optional, Tuple

from potato.training import helper_processes
from potato.training.atomic_files import anonymous_file
from potato.training.probe import first_line

HEADER = struct.Struct("<II")
LENGTH = struct.Struct("<I")
READY = (0, 0)
FAILED = 0xFFFFFFFF
STDERR_TAIL = 2000  # the most of the child's stderr a failure message quotes


def session_options(onnxruntime: Any, threads: int) -> Any:
    """The session's settings: ``threads`` threads for each operator, one graph at a time, every fusion."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return options


class SessionFailed(RuntimeError):
    """The session process could not start, or stopped: the message says what it said, or how it ended."""


class SessionProcess:
    """The ONNX model at ``path`` run by ONNX Runtime in a child process, ``threads`` threads; :meth:`close`
    (or leaving the ``with`` block) stops it.

    :meth:`logits` takes numpy arrays of token ids and their mask and gives
    the logits, as ``InferenceSession.run`` would. Raises
    :class:`SessionFailed` where the child cannot make its session or ends.
    """

    def __init__(self, path: str, threads: int):
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        # Its stderr goes to a file: a pipe nobody reads could fill and stall it; the file is quoted on failure.
        self._stderr = anonymous_file()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "potato.training.trainers.onnx_session", path, str(int(threads))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env, close_fds=True)
        helper_processes.add(self._process.pid)  # its memory is the run's: max_ram_mb counts it
        try:
            if self._read_header() != READY:
                raise SessionFailed("the session process answered out of turn")
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self._process.pid

    def logits(self, input_ids: Any, attention_mask: Any) -> Any:
        """The model's logits (a float32 numpy array, one row per row of ``input_ids``)."""
        import numpy

        rows, tokens = input_ids.shape
        try:
            self._process.stdin.write(HEADER.pack(rows, tokens))
            self._process.stdin.write(numpy.ascontiguousarray(input_ids, dtype="<i8").tobytes())
            self._process.stdin.write(numpy.ascontiguousarray(attention_mask, dtype="<i8").tobytes())
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise SessionFailed(self._ended()) from None
        got_rows, outputs = self._read_header()
        if got_rows != rows:
            raise SessionFailed("the session process answered {} rows for {}".format(got_rows, rows))
        data = _read_exactly(self._process.stdout, 4 * rows * outputs)
        if data is None:
            raise SessionFailed(self._ended())
        return numpy.frombuffer(bytearray(data), dtype="<f4").reshape(rows, outputs)  # writable, as torch wants

    def _read_header(self) -> Tuple[int, int]:
        header = _read_exactly(self._process.stdout, HEADER.size)
        if header is None:
            raise SessionFailed(self._ended())
        rows, outputs = HEADER.unpack(header)
        if rows == FAILED:
            length = _read_exactly(self._process.stdout, LENGTH.size)
            message = _read_exactly(self._process.stdout, LENGTH.unpack(length)[0]) if length else None
            raise SessionFailed((message or b"").decode("utf-8", "replace") or self._ended())
        return rows, outputs

    def _ended(self) -> str:
        """How the child ended, with the end of what it wrote on stderr."""
        try:
            status = self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            status = self._process.wait()
        how = ("was killed by signal {}".format(-status) if status < 0
               else "ended with status {}".format(status))
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - STDERR_TAIL))
        said = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
        return "the session process {}{}".format(how, ": " + said[-1] if said else "")

    def close(self) -> None:
        process = self._process
        if process.poll() is None:
            try:
                process.stdin.close()  # the child's cue to leave
                process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                process.kill()
                process.wait()
        helper_processes.discard(process.pid)
        for stream in (process.stdin, process.stdout, self._stderr):
            try:
                stream.close()
            except OSError:
                pass

    def __enter__(self) -> "SessionProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _read_exactly(stream: BinaryIO, size: int) -> Optional[bytes]:
    """``size`` bytes from ``stream``, or None where it ends first."""
    parts = []  # type: List[bytes]
    while size > 0:
        part = stream.read(size)
        if not part:
            return None
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


# -- the child ---------------------------------------------------------------------


def serve(path: str, threads: int, requests: BinaryIO, answers: BinaryIO) -> int:
    """Make the session, answer ``READY``, then answer each request until ``requests`` ends."""
    try:
        import numpy
        import onnxruntime

        session = onnxruntime.InferenceSession(path, session_options(onnxruntime, threads),
                                               providers=["CPUExecutionProvider"])
        answers.write(HEADER.pack(*READY))
        answers.flush()
        while True:
            header = _read_exactly(requests, HEADER.size)
            if header is None:
                return 0
            rows, tokens = HEADER.unpack(header)
            arrays = []
            for _ in range(2):
                data = _read_exactly(requests, 8 * rows * tokens)
                if data is None:
                    return 0
                arrays.append(numpy.frombuffer(data, dtype="<i8").reshape(rows, tokens))
            logits = session.run(["logits"], {"input_ids": arrays[0], "attention_mask": arrays[1]})[0]
            logits = numpy.ascontiguousarray(logits, dtype="<f4")
            answers.write(HEADER.pack(logits.shape[0], logits.shape[1]))
            answers.write(logits.tobytes())
            answers.flush()
    except BrokenPipeError:
        return 0
    except Exception as exc:
        data = first_line(exc).encode("utf-8", "replace")[:STDERR_TAIL]
        try:
            answers.write(HEADER.pack(FAILED, 0) + LENGTH.pack(len(data)) + data)
            answers.flush()
        except OSError:
            pass
        return 1


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m potato.training.trainers.onnx_session MODEL THREADS\n")
        return 2
    # The frames are the only thing on stdout: whatever else would print goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(argv[0], int(argv[1]), sys.stdin.buffer, answers)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
