"""Items spread over an encoder's embedding space: mean-pooled embeddings, k-means, and the orders made with them.

Two orders use it, both in the worker, where the model is:

- the ``diverse`` strategy (``potato.training.trainers.uncertainty``): the trained
  model's embeddings of the most uncertain items, clustered into one batch's
  worth of clusters, the most uncertain of each first, so that one batch does
  not spend its labels on near-copies of one confusing sentence (Zhdanov 2019,
  "Diverse mini-batch Active Learning"; Citovsky et al. 2021, "Cluster-Margin");
- cold start (``potato.training.trainers.cold_start``): before any model, the shipped
  encoder's embeddings of the unlabelled items, so that the first batch
  covers the corpus rather than its first lines, in typical-clustering order.

Typical clustering (Hacohen, Dekel & Weinshall, ICML 2022, "TypiClust"): with
no model yet, the items farthest apart (k-centre greedy, Sener & Savarese
2018) are a corpus's outliers, and a first batch of them taught the default
trainer less than a random one did (SST-2, 50 labels, 3 seeds: 0.635 against
0.684 test accuracy). Instead each batch clusters the items (spherical
k-means, k = the items covered so far plus the batch) and takes, from each
cluster no covered item falls in, largest first, its most typical item: the
one whose ``TYPICAL_NEIGHBOURS`` nearest neighbours in its cluster are the
closest. A pool above ``MAX_CLUSTERED`` items is clustered on a seeded sample
of that many, and no k-means makes more than ``MAX_CLUSTERS`` clusters (a
sample of the covered items stands for them beyond); past ``batches`` batches,
or ``MAX_CLUSTERS`` picks, the rest follow by distance to what was picked,
farthest first.

Part of the remote half: standard library at import; torch is passed in.
"""

from typing import Any, Callable, Iterable, List, Optional, Sequence

# Texts per forward pass when embedding (the pass is prediction-sized: no gradients).
EMBED_ROWS = 64
# Typical clustering: the neighbours an item's typicality is measured on, the smallest cluster worth a pick
# (TypiClust's 20 and 5), k-means' most iterations, and the most items clustered (a seeded sample beyond).
TYPICAL_NEIGHBOURS = 20
MIN_CLUSTER = 5
KMEANS_ITERATIONS = 20
MAX_CLUSTERED = 10000
# The most clusters one k-means makes and the most items typical clustering picks in all (a large batch, or many
# items labelled before the cold start, would otherwise make a k-means of thousands of clusters on a CPU).
MAX_CLUSTERS = 1000


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


def typical_order(torch: Any, candidates: Any, covered: Optional[Any] = None, batch: int = 50, batches: int = 10,
                  seed: int = 0, check: Optional[Callable[[], None]] = None) -> List[int]:
    """The rows of ``candidates`` (normalised embeddings) in typical-clustering order, ``batches`` batches of
    ``batch``; ``covered``: embeddings already labelled. The rest follow by distance to the picked rows and
    ``covered``, farthest first."""
    n = int(candidates.shape[0])
    if n == 0:
        return []
    width = int(candidates.shape[1])
    known = covered if covered is not None and int(covered.shape[0]) > 0 else torch.zeros((0, width))
    generator = torch.Generator().manual_seed(seed)
    rows = list(range(n))
    if n > MAX_CLUSTERED:
        rows = sorted(int(i) for i in torch.randperm(n, generator=generator)[:MAX_CLUSTERED])
    picked = []  # type: List[int]
    for round_ in range(batches):
        done = set(picked)
        free = [i for i in rows if i not in done]
        want = min(batch, len(free), MAX_CLUSTERS - len(picked))
        if want <= 0:
            break
        seen = torch.cat([known, candidates[picked]]) if picked else known
        if int(seen.shape[0]) > MAX_CLUSTERS - want:  # a seeded sample of the covered items stands for them all
            seen = seen[torch.randperm(int(seen.shape[0]), generator=generator)[:MAX_CLUSTERS - want]]
        points = torch.cat([candidates[free], seen])
        k = min(int(points.shape[0]), int(seen.shape[0]) + want)
        assigned = _spherical_kmeans(torch, points, k, seed + round_, check)
        members = {}  # type: dict
        for position, cluster in enumerate(assigned[:len(free)].tolist()):
            members.setdefault(cluster, []).append(free[position])
        taken = set(assigned[len(free):].tolist())
        clusters = sorted(members, key=lambda c: (c in taken, len(members[c]) < MIN_CLUSTER, -len(members[c]), c))
        for cluster in clusters[:want]:
            picked.append(_most_typical(torch, candidates, members[cluster]))
    chosen = set(picked)
    rest = [i for i in range(n) if i not in chosen]
    if rest:
        reference = torch.cat([known, candidates[picked]]) if picked or int(known.shape[0]) else None
        nearest = _distance_to(torch, candidates[rest], reference) if reference is not None \
            else torch.zeros(len(rest))
        rest = [i for _, i in sorted(zip((-float(d) for d in nearest), rest))]
    return picked + rest


def clustered_order(torch: Any, candidates: Any, batch: int, seed: int = 0,
                    check: Optional[Callable[[], None]] = None) -> List[int]:
    """The rows of ``candidates`` (normalised embeddings, the most uncertain first) with one batch spread over
    them: k-means into ``batch`` clusters, the most uncertain row of each first (in row order), the rest in row
    order after them."""
    n = int(candidates.shape[0])
    if n <= batch:
        return list(range(n))
    assigned = _spherical_kmeans(torch, candidates, batch, seed, check).tolist()
    first = {}  # type: dict
    for row, cluster in enumerate(assigned):
        first.setdefault(cluster, row)
    picked = sorted(first.values())
    chosen = set(picked)
    return picked + [row for row in range(n) if row not in chosen]


def _spherical_kmeans(torch: Any, points: Any, k: int, seed: int, check: Optional[Callable[[], None]]) -> Any:
    """Each row's cluster (0..k-1) by k-means on cosine similarity, seeded by k-means++."""
    generator = torch.Generator().manual_seed(seed)
    n = int(points.shape[0])
    first = int(torch.randint(n, (1,), generator=generator))
    chosen = [first]
    unchosen = iter(range(n))
    nearest = (1.0 - points @ points[first]).clamp(min=0.0)
    while len(chosen) < k:
        if check is not None and len(chosen) % 256 == 0:
            check()
        total = float(nearest.sum())
        if total > 0:
            pick = int(torch.multinomial(nearest / total, 1, generator=generator))
        else:  # every row sits on a centre already (copies of one text): any row not yet a centre
            pick = next(i for i in unchosen if i not in chosen)
        chosen.append(pick)
        nearest = torch.minimum(nearest, (1.0 - points @ points[pick]).clamp(min=0.0))
    centres = points[chosen].clone()
    assigned = None
    for _ in range(KMEANS_ITERATIONS):
        if check is not None:
            check()
        now = (points @ centres.T).argmax(dim=1)
        if assigned is not None and bool(torch.equal(now, assigned)):
            break
        assigned = now
        sums = torch.zeros_like(centres).index_add_(0, assigned, points)
        empty = torch.bincount(assigned, minlength=k) == 0
        centres = torch.where(empty.unsqueeze(1), centres, torch.nn.functional.normalize(sums, dim=1))
    return assigned


def _most_typical(torch: Any, candidates: Any, members: List[int]) -> int:
    """The member whose nearest neighbours in ``members`` are the closest (the lowest mean distance); ties go to
    the first."""
    if len(members) < 3:
        return members[0]
    rows = candidates[members]
    distance = 1.0 - rows @ rows.T
    near = min(TYPICAL_NEIGHBOURS, len(members) - 1)
    # the smallest near+1 distances include the item's own 0
    mean = distance.topk(near + 1, dim=1, largest=False).values.sum(dim=1) / near
    return members[int(torch.argmin(mean))]


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
