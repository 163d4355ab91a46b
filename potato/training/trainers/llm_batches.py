"""Left-padded batches of ``(prompt ids, answer ids)`` rows for a causal LM, and each answer's log-probability.

Every row's answer ends in the last column, so the logits the answers need
are the last ``width + 1`` positions of every row (``logits_to_keep``): the
fine-tune's cross-entropy and the preference objective's sums both read only
those.

Part of the remote half: torch is imported inside the functions.
"""

from typing import Any, List, Optional, Sequence, Tuple

Row = Tuple[List[int], List[int]]


def training_batch(rows: Sequence[Row], pad_id: int):
    """Left-padded ``(ids, mask, targets, target_mask, width)``: every row's answer ends in the last column;
    ``targets`` are the last ``width`` columns (the longest answer), ``target_mask`` marks each row's answer."""
    import torch

    length = max(len(p) + len(a) for p, a in rows)
    width = max(len(a) for _, a in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    target_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for row, (prompt, answer) in enumerate(rows):
        seq = prompt + answer
        ids[row, length - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[row, length - len(seq):] = 1
        target_mask[row, width - len(answer):] = True
    return ids, mask, ids[:, length - width:].clone(), target_mask, width


def answer_logits(model: Any, rows: Sequence[Row], pad_id: int, dev: Any, keep: Optional[str]):
    """``(logits, targets, target_mask)`` for the answers of ``rows``: the fp32 logits that predict each answer
    token (``(rows, width, vocabulary)``), the tokens, and where each row's answer is."""
    ids, mask, targets, target_mask, width = training_batch(rows, pad_id)
    ids, mask, targets, target_mask = dev.put(ids), dev.put(mask), dev.put(targets), dev.put(target_mask)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with dev.autocast():
        kwargs = {keep: width + 1} if keep else {}
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False, **kwargs).logits
    return logits[:, -(width + 1):-1].float(), targets, target_mask


def answer_logps(model: Any, rows: Sequence[Row], pad_id: int, dev: Any, keep: Optional[str]):
    """Each row's answer's log-probability given its prompt (the sum over its tokens), a ``(rows,)`` tensor."""
    logits, targets, target_mask = answer_logits(model, rows, pad_id, dev, keep)
    token_logps = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (token_logps * target_mask).sum(-1)
