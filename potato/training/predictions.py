"""``predictions.jsonl``, streamed: one line per prediction as it is made, published whole.

A run over 100 000 unlabelled items must not hold 100 000 records until the
end, so predictions go to disk batch by batch under a temporary name and are
renamed to ``predictions.jsonl`` only when every schema is done: a reader
never sees half a file, and a run stopped mid-way leaves none (as
docs/architecture.md, "The job directory", promises).

A data-parallel run writes one part per process (``ranks/<rank>/predictions.part``);
rank 0 joins the parts in rank order when all processes are done.

Part of the remote half: Python 3.8, standard library only.
"""

import io
import json
import os
import shutil
from typing import Any, Dict, Optional, Sequence

from potato.training import atomic_files
from potato.training.escaping import ENCODE_ERRORS, open_text
from potato.training.job_paths import PREDICTIONS, JobPaths

FINAL_NAME = PREDICTIONS
PART_NAME = "predictions.part"


def rank_dir(job_dir: str, rank: int) -> str:
    """Where process ``rank`` of a data-parallel run keeps its own files."""
    return JobPaths(job_dir).rank(rank).dir


class PredictionStream:
    """Append prediction records to a file; ``publish`` makes it ``predictions.jsonl``.

    ``rank`` None: this process writes the whole file. A rank: this process
    writes its part; :func:`publish_parts` joins them.
    """

    def __init__(self, job_dir: str, rank: Optional[int] = None):
        self.job_dir = job_dir
        self._whole = None  # type: Optional[atomic_files.Replacement]
        if rank is None:
            self._whole = atomic_files.Replacement(job_dir, FINAL_NAME)
            self._file = io.TextIOWrapper(self._whole.file, encoding="utf-8", errors=ENCODE_ERRORS, newline="")
        else:
            os.makedirs(rank_dir(job_dir, rank), exist_ok=True)
            self._file = open_text(os.path.join(rank_dir(job_dir, rank), PART_NAME))
        self.count = 0

    def write(self, record: Dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.count += 1

    def close(self) -> None:
        if self._whole is not None:  # the whole file stays a temporary until publish
            self._file.flush()
            return
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def publish(self) -> str:
        """Rename the whole file into place (single process only); returns its path."""
        assert self._whole is not None, "a rank's part is joined by publish_parts"
        self._file.flush()
        self._whole.commit()
        self._whole.close()
        return os.path.join(self.job_dir, FINAL_NAME)

    def discard(self) -> None:
        """Remove what was written (the run failed or was stopped)."""
        if self._whole is not None:
            self._whole.close()  # never committed: the temporary goes
            return
        self.close()


def finish_run(job: Any, events: Any, stream: PredictionStream, group: Any, scores: Dict[str, Any]) -> None:
    """The end of a trainer's run, once every schema is done: ``predictions.jsonl`` published whole (a
    data-parallel run's parts joined by rank 0 once all are written), then rank 0's ``scores.json`` and
    ``metrics`` event."""
    if group.size == 1:
        stream.publish()
    else:
        stream.close()
        group.barrier()  # every part is complete
        if group.is_main:
            publish_parts(job.dir, range(group.size))
    if group.is_main:
        job.write_scores(scores)
        events.metrics(scores)


def publish_parts(job_dir: str, ranks: Sequence[int]) -> str:
    """Join the ranks' parts, in rank order, into ``predictions.jsonl`` (temp name, then rename)."""
    final = os.path.join(job_dir, FINAL_NAME)
    with atomic_files.replacing(final) as out:
        for rank in ranks:
            part = os.path.join(rank_dir(job_dir, rank), PART_NAME)
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    for rank in ranks:
        os.remove(os.path.join(rank_dir(job_dir, rank), PART_NAME))
    return final
