"""Asking a causal LM for answers: score labels, decide yes/no per label, generate text.

All three start the same way: one pass over a batch of prompts (left-padded,
so every prompt ends at the same column) fills the attention cache, and the
answer's tokens are then fed on top of that cache a few at a time. The
prompt, nearly all of the work, is computed once per item whatever the
number of labels:

- **label scoring** (nominal, ordinal): a label's score is the sum of the
  log-probabilities of its tokens and of the end of the answer after them,
  i.e. the log-probability of generating exactly that label; a softmax over
  the schema's labels turns the scores into the probability of each label
  given that the answer is one of them. Summed, not averaged per token: an
  average would flatten the confidence of labels whose later tokens are
  certain (``very positive`` after ``very``), and the end token already
  keeps a label that is a prefix of another (``good``, ``good enough``) from
  winning by being short. The first token of every label comes from the
  prompt's own pass; the rest of all labels takes one more pass of a few
  tokens, on a copy of each row's cache per label, after which the cache is
  cut back to the prompt.
- **yes/no per label** (multilabel): the answer is one line per label in
  schema order (``label: yes``); each decision is the more likely of
  ``yes``/``no`` given the prompt and the decisions before it, and its
  probability is ``P(yes)`` normalised over the two. The set is the model's
  own greedy reading of its joint distribution, one label at a time.
- **greedy generation** (text): the most likely next token until an end
  token or ``max_new_tokens``.

Each step asks ``check()`` first, so a cancel stops prediction between
steps. Positions are passed explicitly (a left-padded row's first real token
is position 0), so the model sees the same positions as in training.

Part of the remote half: torch is imported inside the functions.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple


class Decoder:
    """The attention cache of a batch of prompts, and the next-token log-probabilities of each row.

    ``model``: a causal LM (peft-wrapped or not) in eval mode; ``put``:
    moves a CPU tensor to the model's device; ``autocast``: a context
    manager factory for the forward passes.
    """

    def __init__(self, model: Any, pad_id: int, put: Callable[[Any], Any], autocast: Callable[[], Any]):
        self.model, self.pad_id, self.put, self.autocast = model, pad_id, put, autocast
        self.cache_keyword = cache_keyword(model)
        self.logits_keyword = logits_keyword(model)
        self.cache = None  # type: Any
        self.mask = None  # type: Any  # (rows, columns so far): 1 where a real token is
        self.lengths = None  # type: Any  # (rows,): real tokens so far
        self.next_logp = None  # type: Any  # (rows, vocabulary), float32, on the model's device

    def start(self, prompts: Sequence[Sequence[int]], pad_multiple: int = 1) -> None:
        """Run the prompts (left-padded) and keep their cache."""
        import torch

        width = max(len(p) for p in prompts)
        width += -width % pad_multiple
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt):] = 1
        self.mask = self.put(mask)
        self.lengths = self.mask.sum(-1)
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        out = self._forward(self.put(ids), positions, None, keep=1)
        self.cache = _cache_of(out)
        self.next_logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)

    def append(self, chunks: Sequence[Sequence[int]]) -> None:
        """Feed each row its own ``chunk`` of tokens (rows may get none); update each row's next log-probabilities."""
        import torch

        width = max(len(c) for c in chunks)
        if width == 0:
            return
        ids = torch.full((len(chunks), width), self.pad_id, dtype=torch.long)
        new = torch.zeros((len(chunks), width), dtype=torch.long)
        for row, chunk in enumerate(chunks):
            if chunk:
                ids[row, :len(chunk)] = torch.tensor(list(chunk), dtype=torch.long)
                new[row, :len(chunk)] = 1
        new = self.put(new)
        positions = self.lengths.unsqueeze(-1) + torch.arange(width, device=new.device)
        self.mask = torch.cat([self.mask, new], dim=-1)
        out = self._forward(self.put(ids), positions, self.cache, keep=0)
        self.cache = _cache_of(out)
        self.lengths = self.lengths + new.sum(-1)
        took = [len(c) for c in chunks]
        rows = [r for r, n in enumerate(took) if n]
        last = torch.tensor([took[r] - 1 for r in rows], device=out.logits.device)
        picked = out.logits[torch.tensor(rows, device=out.logits.device), last].float()
        self.next_logp[rows] = torch.log_softmax(picked, dim=-1)

    def score(self, candidates: Sequence[Sequence[int]]) -> Any:
        """``(rows, candidates)`` tensor (on the CPU): the log-probability of each candidate continuing each row.

        The first token of every candidate is read from the rows' next-token
        log-probabilities; the rest of all candidates is fed in one pass, on
        a copy of each row's cache per candidate (a cache cut back to the
        rows afterwards, as it was).
        """
        import torch

        rows = self.next_logp.shape[0]
        scores = self.next_logp[:, [c[0] for c in candidates]].float()
        longer = [j for j, c in enumerate(candidates) if len(c) > 1]
        if not longer:
            return scores.cpu()
        width = max(len(candidates[j]) - 1 for j in longer)
        n = len(longer)
        heads = torch.full((n, width), self.pad_id, dtype=torch.long)
        tails = torch.zeros((n, width), dtype=torch.long)
        real = torch.zeros((n, width), dtype=torch.long)
        for k, j in enumerate(longer):
            c = list(candidates[j])
            heads[k, :len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
            tails[k, :len(c) - 1] = torch.tensor(c[1:], dtype=torch.long)
            real[k, :len(c) - 1] = 1
        # Row r's copies are rows r*n .. r*n+n-1 of the expanded batch, one per longer candidate.
        ids = self.put(heads.repeat(rows, 1))
        new = self.put(real.repeat(rows, 1))
        self.cache.batch_repeat_interleave(n)
        mask = torch.cat([self.mask.repeat_interleave(n, dim=0), new], dim=-1)
        positions = self.lengths.repeat_interleave(n).unsqueeze(-1) + torch.arange(width, device=new.device)
        out = self._forward(ids, positions, self.cache, keep=0, mask=mask)
        self.cache = _cache_of(out)
        self.cache.batch_select_indices(torch.arange(0, rows * n, n, device=new.device))
        self.cache.crop(-width)
        logp = torch.log_softmax(out.logits.float(), dim=-1)
        picked = logp.gather(-1, self.put(tails.repeat(rows, 1)).unsqueeze(-1)).squeeze(-1) * new
        scores[:, longer] += picked.sum(-1).view(rows, n)
        return scores.cpu()

    def decide(self, heads: Sequence[Sequence[int]], decisions: Tuple[Sequence[int], Sequence[int]],
               check: Callable[[], None]) -> Tuple[List[List[bool]], List[List[float]]]:
        """One yes/no decision per head, in order: ``(chosen yes per row and head, P(yes) per row and head)``."""
        import torch

        rows = self.next_logp.shape[0]
        chosen = [[] for _ in range(rows)]  # type: List[List[bool]]
        p_yes = [[] for _ in range(rows)]  # type: List[List[float]]
        previous = [[] for _ in range(rows)]  # type: List[List[int]]
        for head in heads:
            check()
            self.append([prev + list(head) for prev in previous])
            pair = torch.softmax(self.score(decisions), dim=-1)
            for row in range(rows):
                yes = float(pair[row, 0])
                p_yes[row].append(yes)
                chosen[row].append(yes >= 0.5)
                previous[row] = list(decisions[0 if yes >= 0.5 else 1])
        return chosen, p_yes

    def generate(self, max_new_tokens: int, stops: Any, check: Callable[[], None]) -> List[List[int]]:
        """Greedy continuation of each row, up to ``max_new_tokens`` or an id in ``stops`` (left out)."""
        rows = self.next_logp.shape[0]
        out = [[] for _ in range(rows)]  # type: List[List[int]]
        running = [True] * rows
        for step in range(max_new_tokens):
            check()
            best = self.next_logp.argmax(-1).tolist()
            for row in range(rows):
                if running[row] and best[row] in stops:
                    running[row] = False
                elif running[row]:
                    out[row].append(best[row])
            if not any(running) or step == max_new_tokens - 1:
                break
            self.append([[best[row]] if running[row] else [] for row in range(rows)])
        return out

    def _forward(self, ids: Any, positions: Any, cache: Any, keep: int, mask: Optional[Any] = None) -> Any:
        kwargs = {"input_ids": ids, "attention_mask": self.mask if mask is None else mask,
                  "position_ids": positions, "use_cache": True}
        if cache is not None:
            kwargs[self.cache_keyword] = cache
        if self.logits_keyword:
            kwargs[self.logits_keyword] = keep
        with self.autocast():
            return self.model(**kwargs)


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _base_forward(model: Any) -> Any:
    """The forward method of the transformers model under any wrappers (peft, DDP)."""
    while hasattr(model, "module") and not hasattr(model, "config"):
        model = model.module  # DDP
    get_base = getattr(model, "get_base_model", None)
    return (get_base() if get_base is not None else model).forward


def cache_keyword(model: Any) -> str:
    """``cache`` (transformers 5.x) or ``past_key_values`` (before): what the model's forward calls the cache."""
    import inspect

    return "cache" if "cache" in inspect.signature(_base_forward(model)).parameters else "past_key_values"


def logits_keyword(model: Any) -> Optional[str]:
    """The keyword that asks a model for the logits of its last N positions only (0: all), where it has one.

    ``logits_to_keep`` since transformers 4.50, ``num_logits_to_keep`` in 4.45-4.49; older models compute all.
    """
    import inspect

    params = inspect.signature(_base_forward(model)).parameters
    return next((name for name in ("logits_to_keep", "num_logits_to_keep") if name in params), None)
