"""``objective: dpo`` in hf-llm-finetune: a LoRA learns which of two responses to a prompt annotators preferred.

A pairwise schema's item is a prompt (its text, through ``prompt_template``:
``{text}`` by default, the annotators' question is not the model's) and two
responses (the bundle's ``sides``). Each training comparison with a majority
(not a tie) is a pair, chosen over rejected, and direct preference
optimisation (Rafailov et al., 2023) trains the adapter on

    -log sigmoid(beta * ((log π(chosen) - log π_ref(chosen)) - (log π(rejected) - log π_ref(rejected))))

``log π`` is the sum of a response's token log-probabilities given the
prompt (a response ends the way an answer ends), ``π`` the model with its
adapter and ``π_ref`` the same model with the adapter disabled: the base
weights, with no second copy in memory. A new LoRA adapter adds nothing
(its second matrix starts at zero), so ``π_ref``'s numbers for the training
pairs are computed once, before the first step, and kept.

The tuned model's reward for a response is ``beta * (log π - log π_ref)``
(DPO's implicit reward), and the probability that annotators prefer B is
``sigmoid(reward(B) - reward(A))``: predictions have hf-reward-model's shape
(``label``, ``confidence``, ``probs``, ``rewards``). Holdout: the agreement
of the tuned model with the held-out majority and with each annotator, and
``agreement_before``, the base model's (the side whose response it finds the
more likely), so that the run says what training changed.

Part of the remote half: torch is imported inside the functions.
"""

import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from potato.training.answer_kinds import COMPARISON, SIDES, TIE, majority_side
from potato.training.events import TrainerFailure
from potato.training.trainers.llm_batches import answer_logps
from potato.training.trainers.llm_prompts import PromptTooLong
from potato.training.trainers.schedule import Validation

SFT, DPO = "sft", "dpo"
OBJECTIVES = (SFT, DPO)
DEFAULT_BETA = 0.1  # DPO's and TRL's DPOTrainer's default

# What a DPO-tuned adapter's score is, for the Hub card.
SCORE_MEANING = ("DPO's implicit reward of a response, beta * (log p(response | prompt) with the adapter - "
                 "the same without it); sigmoid(reward(B) - reward(A)) is the probability that annotators "
                 "prefer B")

Triple = Tuple[List[int], List[int], List[int]]  # the prompt's ids, response A's, response B's


def objective_problems(options: Dict[str, Any]) -> List[str]:
    """What is wrong with the ``objective`` and ``beta`` options (empty when nothing is)."""
    problems = []
    if "objective" in options and options["objective"] not in OBJECTIVES:
        problems.append("objective must be sft (learn the annotators' answers) or dpo (learn which of two "
                        "responses they preferred), got {!r}".format(options["objective"]))
    beta = options.get("beta")
    if "beta" in options and not (isinstance(beta, (int, float)) and not isinstance(beta, bool)
                                  and math.isfinite(beta) and beta > 0):
        problems.append("beta must be a number above 0 (DPO's usual: 0.1), got {!r}".format(beta))
    return problems


def objective_words(options: Dict[str, Any]) -> str:
    """What trained the adapter, in a sentence (the Hub card's)."""
    if options.get("objective", SFT) == DPO:
        return ("Objective: dpo (direct preference optimisation, beta {:g}): which of two responses to the "
                "prompt annotators preferred; the reference model is the base model, its adapter disabled."
                .format(options.get("beta", DEFAULT_BETA)))
    return "Objective: sft: the annotators' answers, the loss on the answer's tokens only."


def objective_mismatch(objective: str, schemas: Sequence[Tuple[str, str]], trainer: str) -> Optional[str]:
    """Why ``objective`` cannot train one of ``schemas`` (``(name, kind)`` pairs), or None when it trains them all."""
    for name, kind in schemas:
        if objective == DPO and kind != COMPARISON:
            return ("objective dpo learns pairwise comparisons only, and schema {!r} is {}: train it in a run of "
                    "its own with objective sft (--schema picks a run's schemas)".format(name, kind))
        if objective == SFT and kind == COMPARISON:
            return ("Schema {!r} is a pairwise comparison: {} learns it with objective dpo (set "
                    "model_training.trainers.{}.objective: dpo, or --option objective=dpo for one run), or "
                    "hf-reward-model trains a reward model on it".format(name, trainer, trainer))
    return None


def chosen_sign(counts: Dict[str, int]) -> int:
    """+1 where the majority chose B, -1 where it chose A, 0 for a tie (no pair to learn from)."""
    side = majority_side(counts)
    return 0 if side == TIE else 1 if side == SIDES[1] else -1


class Pairs:
    """Each comparison's prompt and two responses as token ids, cut to ``max_length``, tokenized when first asked."""

    def __init__(self, fmt: Any, template: str, schema: Any, items: Any, max_length: int):
        self.fmt, self.template, self.schema, self.items = fmt, template, schema, items
        self.max_length = max_length
        self.cut = 0  # comparisons whose prompt or a response was cut
        self._ids = {}  # type: Dict[int, Triple]

    def sides(self, position: int) -> Optional[Tuple[str, List[str]]]:
        item = self.items.record(position)
        sides = (item.get("sides") or {}).get(self.schema.schema)
        if not (isinstance(sides, list) and len(sides) == 2 and all(isinstance(s, str) for s in sides)):
            return None
        return str(item.get("text") or ""), sides

    def has(self, position: int) -> bool:
        return self.sides(position) is not None

    def tokens(self, position: int) -> Triple:
        found = self._ids.get(position)
        if found is None:
            text, sides = self.sides(position)
            limit = self.max_length // 2  # a response keeps at most half the room; a cut one loses its end
            responses = [self.fmt.encode(side) + self.fmt.end for side in sides]
            was_cut = any(len(r) > limit for r in responses)
            responses = [r[:limit] for r in responses]
            try:
                prompt, prompt_cut = self.fmt.fit_prompt(self.template, text, [], self.schema.description,
                                                         self.max_length - max(map(len, responses)))
            except PromptTooLong as exc:
                raise TrainerFailure(
                    "max_length {} is too short for schema {!r}'s prompt: without the item's text it takes {} "
                    "tokens where {} are left beside its responses; raise max_length or shorten prompt_template"
                    .format(self.max_length, self.schema.schema, exc.tokens, exc.room))
            self.cut += was_cut or prompt_cut
            found = self._ids[position] = (prompt, responses[0], responses[1])
        return found

    def length(self, position: int) -> int:
        prompt, a, b = self.tokens(position)
        return len(prompt) + max(len(a), len(b))


def _logps(model: Any, pairs: Pairs, rows: Sequence[int], pad_id: int, dev: Any, keep: Optional[str]):
    """``(rows,)`` tensors of response A's and response B's log-probabilities, both in one forward pass."""
    triples = [pairs.tokens(i) for i in rows]
    both = answer_logps(model, [(p, a) for p, a, _ in triples] + [(p, b) for p, _, b in triples], pad_id, dev, keep)
    return both[:len(rows)], both[len(rows):]


def _batches(pairs: Pairs, positions: Sequence[int], batch_size: int) -> List[List[int]]:
    order = sorted(positions, key=pairs.length, reverse=True)
    return [order[k:k + batch_size] for k in range(0, len(order), batch_size)]


def log_likelihoods(model: Any, pairs: Pairs, positions: Sequence[int], pad_id: int, dev: Any, keep: Optional[str],
                    batch_size: int, reference: bool, check: Any = None) -> Iterator[Tuple[int, float, float]]:
    """``(position, log π(A), log π(B))`` for each comparison at ``positions``; ``reference``: with the adapter
    disabled (the base model's numbers)."""
    import contextlib

    import torch

    was_training = model.training
    model.eval()
    with torch.inference_mode(), (model.disable_adapter() if reference else contextlib.nullcontext()):
        for batch in _batches(pairs, positions, batch_size):
            if check is not None:
                check()
            logp_a, logp_b = _logps(model, pairs, batch, pad_id, dev, keep)
            for i, a, b in zip(batch, logp_a.tolist(), logp_b.tolist()):
                yield i, a, b
            dev.release()
    model.train(was_training)


def batch_loss(pairs: Pairs, positions: List[int], reference: Dict[int, Tuple[float, float]], signs: Dict[int, int],
               beta: float, pad_id: int, dev: Any, keep: Optional[str]):
    """hf_common's ``batch_loss``: DPO's loss on the comparisons ``mine``, a share of the step's mean."""
    import torch
    import torch.nn.functional as F

    def loss(model: Any, mine: List[int], step: List[int], weight: float) -> Any:
        rows = [positions[k] for k in mine]
        logp_a, logp_b = _logps(model, pairs, rows, pad_id, dev, keep)
        ref_gap = dev.put(torch.tensor([reference[i][1] - reference[i][0] for i in rows], dtype=torch.float32))
        sign = dev.put(torch.tensor([signs[i] for i in rows], dtype=torch.float32))
        chosen_over_rejected = beta * sign * ((logp_b - logp_a) - ref_gap)
        return -F.logsigmoid(chosen_over_rejected).sum() * (weight / len(step))

    return loss


def validation(pairs: Pairs, positions: List[int], reference: Dict[int, Tuple[float, float]], signs: Dict[int, int],
               beta: float, pad_id: int, dev: Any, keep: Optional[str], batch_size: int) -> Optional[Any]:
    """The training loop's ``validate`` on the validation share: DPO's mean loss (the lower, the better), shown
    as the share of its pairs where the tuned model prefers the chosen response."""
    if not positions:
        return None

    def validate(model: Any) -> Validation:
        loss = agreed = 0.0
        for i, a, b in log_likelihoods(model, pairs, positions, pad_id, dev, keep, batch_size, False):
            margin = beta * signs[i] * ((b - a) - (reference[i][1] - reference[i][0]))
            loss += max(-margin, 0.0) + math.log1p(math.exp(-abs(margin)))  # -log sigmoid(margin), stably
            agreed += margin > 0
        return Validation(-loss / len(positions), loss / len(positions), agreed / len(positions))

    return validate


def rewards(policy: Tuple[float, float], reference: Tuple[float, float], beta: float) -> Tuple[float, float]:
    """DPO's implicit rewards of responses A and B: ``beta * (log π - log π_ref)``."""
    return beta * (policy[0] - reference[0]), beta * (policy[1] - reference[1])
