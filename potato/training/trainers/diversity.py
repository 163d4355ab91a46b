"""Items spread over an encoder's embedding space: mean-pooled embeddings and a k-centre greedy order.

Two orders use it, both in the worker, where the model is:

- the ``diverse`` strategy (``potato.training.trainers.uncertainty``): the trained
  model's embeddings of the most uncertain items, each next one the farthest
  from the items trained on and those already chosen, so that one batch does
  not spend its labels on near-copies of one confusing sentence;
- cold start (``potato.training.trainers.cold_start``): before any model, the shipped
  encoder's embeddings of the unlabelled items, so that the first batch
  covers the corpus rather than its first lines.

k-centre greedy (Sener & Savarese 2018, "core-set"): each pick is the item
farthest (cosine distance) from everything covered so far; it costs one
matrix-vector product per pick. Past ``max_picks`` the remaining items follow
by their distance to what was picked, farthest first (one more pass), which
keeps a 100 000-item cold start at ``max_picks`` products instead of 100 000.

Part of the remote half: standard library at import; torch is passed in.
"""

from typing import Any, Callable, Iterable, List, Optional, Sequence

# Texts per forward pass when embedding (the pass is prediction-sized: no gradients).
EMBED_ROWS = 64


def mean_pooled(torch: Any, forward: Callable[[Any, Any], Any], tokenizer: Any, texts: Sequence[str],
                max_length: int, device: str, check: Optional[Callable[[], None]] = None) -> Any:
    """The L2-normalised mean of the last hidden states over each text's tokens, one row per text.

    ``forward(input_ids, attention_mask)`` returns the model's last hidden
    states (``[rows, tokens, width]``); texts go longest first in batches of
    ``EMBED_ROWS`` and come back in their own order. ``check`` runs before each
    batch (a stop request raises there).
    """
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    rows = [None] * len(texts)  # type: List[Any]
    with torch.inference_mode():
        for start in range(0, len(order), EMBED_ROWS):
            if check is not None:
                check()
            part = order[start:start + EMBED_ROWS]
            enc = tokenizer([texts[i] for i in part], truncation=True, max_length=max_length, padding=True,
                            return_tensors="pt")
            mask = enc["attention_mask"].to(device)
            hidden = forward(enc["input_ids"].to(device), mask).float()
            weights = mask.unsqueeze(-1).float()
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
            pooled = torch.nn.functional.normalize(pooled, dim=-1).cpu()
            for k, i in enumerate(part):
                rows[i] = pooled[k]
    if not rows:
        return torch.zeros((0, 1))
    return torch.stack(rows)


def k_centre_order(torch: Any, candidates: Any, covered: Optional[Any] = None, max_picks: Optional[int] = None,
                   check: Optional[Callable[[], None]] = None) -> List[int]:
    """The rows of ``candidates`` (normalised embeddings) in k-centre greedy order.

    ``covered``: embeddings already labelled (they count as picked). With
    nothing covered the first pick is row 0 (callers put their most uncertain
    item there); ties go to the lower row. After ``max_picks`` picks the rest
    follow by distance to the picked rows, farthest first.
    """
    n = int(candidates.shape[0])
    if n == 0:
        return []
    limit = n if max_picks is None else max(0, min(n, max_picks))
    if covered is not None and int(covered.shape[0]) > 0:
        nearest = _distance_to(torch, candidates, covered)
    else:
        nearest = torch.full((n,), float("inf"))
    picked = []  # type: List[int]
    taken = torch.zeros(n, dtype=torch.bool)
    for _ in range(limit):
        if check is not None and len(picked) % 256 == 0:
            check()
        scores = nearest.masked_fill(taken, -1.0)
        # inf everywhere (nothing covered, no pick yet): argmax would take row 0 anyway; say so.
        pick = 0 if not picked and bool(torch.isinf(scores[0])) else int(torch.argmax(scores))
        picked.append(pick)
        taken[pick] = True
        distance = 1.0 - candidates @ candidates[pick]
        nearest = torch.minimum(nearest, distance)
    rest = [i for i in range(n) if not bool(taken[i])]
    rest.sort(key=lambda i: (-float(nearest[i]), i))
    return picked + rest


def _distance_to(torch: Any, rows: Any, others: Any, chunk: int = 4096) -> Any:
    """Each row's cosine distance to the nearest of ``others`` (normalised embeddings)."""
    nearest = torch.full((int(rows.shape[0]),), float("inf"))
    for start in range(0, int(others.shape[0]), chunk):
        similarity = rows @ others[start:start + chunk].T
        nearest = torch.minimum(nearest, 1.0 - similarity.max(dim=1).values)
    return nearest


def order_lines(schema: str, ids: Iterable[Any]) -> List[dict]:
    """The prediction lines that carry an order: ``{"id", "schema", "order_rank"}``, rank 0 first."""
    return [{"id": item_id, "schema": schema, "order_rank": rank} for rank, item_id in enumerate(ids)]
