"""The ``diverse`` order, made where the model is: a trainer's share of ``potato.training.trainers.uncertainty``.

A trainer that can embed its items (``hf-text-classification``) builds one
:class:`DiverseOrder` per schema when job.json's ``order`` asks for
``diverse``, shows it each prediction it streams (``observe``), and after the
last one calls ``write``: the ``POOL_FACTOR`` × ``batch`` unlabelled items of
the highest margin number are embedded by the trained model (mean-pooled last
hidden states) and clustered into ``batch`` clusters by k-means; the most
uncertain item of each cluster leads, then the other candidates by margin
(``potato.training.trainers.diversity``), written as order lines
``{"id", "schema", "order_rank"}`` after the predictions. The writeback puts
those items first, in that order, and the rest by margin
(``potato.prefill.review_order``). Memory: one number per unlabelled item, and the
embeddings of the candidates only.

Part of the remote half: standard library at import.
"""

from typing import Any, Callable, Dict, Optional

from potato.training.trainers.diversity import clustered_order, mean_pooled, order_lines
from potato.training.trainers.pooling import encoder_of
from potato.training.trainers.uncertainty import (
    DEFAULT_BATCH,
    DIVERSE,
    MARGIN,
    POOL_FACTOR,
    candidates,
    schema_uncertainty,
)


def order_spec(job: Any) -> Dict[str, Any]:
    """job.json's ``order`` (``{}`` when the run orders nothing); the worker has checked it."""
    spec = getattr(job, "spec", {}).get("order")
    return spec if isinstance(spec, dict) else {}


class DiverseOrder:
    """One schema's candidates for the diverse order, and the order lines made of them."""

    def __init__(self, job: Any, schema: str, kind: str, n_labels: int):
        spec = order_spec(job)
        self.on = spec.get("strategy") == DIVERSE
        self.batch = int(spec.get("batch", DEFAULT_BATCH))
        self.schema, self.kind, self.n_labels = schema, kind, n_labels
        self.numbers = {}  # type: Dict[int, Optional[float]]  # unlabelled item position -> its margin number

    def observe(self, position: int, record: Dict[str, Any], unlabelled: bool) -> None:
        """Note one streamed prediction (only unlabelled items are candidates: the rest are someone's already)."""
        if self.on and unlabelled:
            self.numbers[position] = schema_uncertainty(MARGIN, self.kind, record.get("confidence"),
                                                        record.get("probs"), self.n_labels, record.get("spans"))

    def write(self, torch: Any, stream: Any, items: Any, device: str, max_length: int,
              tokenizer: Any, forward: Callable[[Any, Any], Any], say: Callable[[str], None],
              check: Callable[[], None]) -> int:
        """Embed the candidates, write the order lines; their count."""
        if not self.on or not self.numbers:
            return 0
        positions = sorted(self.numbers)
        ids = [str(items.read(i)[0]) for i in positions]
        numbers = [self.numbers[i] for i in positions]
        chosen = [positions[k] for k in candidates(numbers, ids, POOL_FACTOR * self.batch)]
        texts = [items.read(i)[1] for i in chosen]
        embed = lambda rows: mean_pooled(torch, forward, tokenizer, rows, max_length, device, check)  # noqa: E731
        order = clustered_order(torch, embed(texts), self.batch, check=check)
        lines = order_lines(self.schema, [items.read(chosen[k])[0] for k in order])
        for line in lines:
            stream.write(line)
        say("Schema {!r}: diverse order: the {} most uncertain of {} unlabelled items (margin) go first, the most "
            "uncertain of each of {} clusters of the model's embeddings of them (k-means) leading".format(
                self.schema, len(lines), len(positions), min(self.batch, len(lines))))
        return len(lines)


def hidden_states(model: Any) -> Callable[[Any, Any], Any]:
    """``forward(input_ids, attention_mask)`` giving a classifier's last hidden states: a Hugging Face
    classifier's, or its encoder's for a head of the trainer's own (``potato.training.trainers.pooling``)."""
    encoder = encoder_of(model)

    def forward(input_ids: Any, attention_mask: Any) -> Any:
        if encoder is not None:
            return encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states[-1]

    return forward
