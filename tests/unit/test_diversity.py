"""The orders made from embeddings: a cold start takes each cluster's most typical item, not its outliers; the
diverse strategy's batch takes the most uncertain item of each cluster, not near-copies of one."""

import torch

from potato.training.trainers.diversity import clustered_order, typical_order


def _blobs(sizes, spread=0.05, seed=0, width=16):
    """Normalised rows around one random centre per size, in blocks; the centres returned too."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.nn.functional.normalize(torch.randn(len(sizes), width, generator=generator), dim=1)
    rows = [centres[k] + spread * torch.randn(size, width, generator=generator) for k, size in enumerate(sizes)]
    return torch.nn.functional.normalize(torch.cat(rows), dim=1), centres


def _block(row, sizes):
    for k, size in enumerate(sizes):
        if row < size:
            return k
        row -= size
    raise AssertionError(row)


def test_a_cold_start_takes_one_typical_item_of_each_cluster_largest_first_and_no_outlier():
    sizes = [40, 25, 12]
    blobs, centres = _blobs(sizes)
    outliers = torch.nn.functional.normalize(torch.randn(3, 16, generator=torch.Generator().manual_seed(9)), dim=1)
    rows = torch.cat([blobs, outliers])
    order = typical_order(torch, rows, None, batch=3, batches=2)
    assert sorted(order) == list(range(len(rows)))
    assert [_block(row, sizes) for row in order[:3]] == [0, 1, 2]
    for row in order[:3]:  # the most typical: near its cluster's centre, not at its edge
        members = rows[[i for i in range(len(blobs)) if _block(i, sizes) == _block(row, sizes)]]
        assert float(rows[row] @ centres[_block(row, sizes)]) >= float((members @ centres[_block(row, sizes)]).median())
    assert not set(order[:3]) & {77, 78, 79}


def test_a_cluster_already_labelled_is_left_to_the_others():
    sizes = [40, 25, 12]
    rows, centres = _blobs(sizes)
    order = typical_order(torch, rows, centres[:1], batch=2, batches=1)
    assert sorted(_block(row, sizes) for row in order[:2]) == [1, 2]


def test_no_items_one_item_and_more_batches_than_items():
    rows, _ = _blobs([4])
    assert typical_order(torch, rows[:0], None) == []
    assert typical_order(torch, rows[:1], torch.zeros((0, 1))) == [0]
    assert sorted(typical_order(torch, rows, None, batch=3, batches=5)) == [0, 1, 2, 3]


def test_the_diverse_batch_takes_the_most_uncertain_of_each_cluster_not_near_copies_of_one():
    # rows in order of uncertainty: the five most uncertain are near-copies of one sentence
    rows, _ = _blobs([5, 5, 5], spread=0.01)
    interleaved = torch.cat([rows[:5], rows[5:10], rows[10:]])
    order = clustered_order(torch, interleaved, batch=3)
    assert order[:3] == [0, 5, 10]
    assert order[3:] == [1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14]
    assert clustered_order(torch, interleaved[:2], batch=3) == [0, 1]


def test_copies_of_one_text_and_more_covered_items_than_clusters_still_order_every_item(monkeypatch):
    import potato.training.trainers.diversity as diversity

    monkeypatch.setattr(diversity, "MAX_CLUSTERS", 12)
    same = torch.nn.functional.normalize(torch.ones(30, 16), dim=1)
    assert sorted(typical_order(torch, same, None, batch=5, batches=2)) == list(range(30))
    rows, centres = _blobs([40, 25, 12])
    covered, _ = _blobs([50], seed=3)
    order = typical_order(torch, rows, covered, batch=5, batches=10)
    assert sorted(order) == list(range(77))
