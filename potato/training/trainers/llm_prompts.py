"""From an item and a schema to the tokens a causal LM is trained and asked on.

A prompt is ``prompt_template`` with ``{text}``, ``{labels}`` and
``{description}`` filled in (no other placeholder exists, so a template may
hold any other braces, JSON included). With a tokenizer that has a chat
template the prompt is the user's turn and the answer the assistant's, ended
the way the template ends a turn; without one the prompt is followed by a
newline, the answer by the end-of-sequence token.

Answers per kind of schema (docs/answer-types.md):

- ``nominal``, ``ordinal``: the label, as the schema spells it;
- ``multilabel``: one line per label of the schema, in schema order,
  ``<label>: yes`` or ``<label>: no``;
- ``text``: the annotator's answer.

Every answer is built from token pieces that training and prediction share
(a label's tokens, then the end), never by tokenizing a joined string in one
place and its parts in another: a BPE tokenizer may split ``"a: yes"`` and
``"a:"`` + ``" yes"`` differently, and the scores of prediction would then
be for sequences the model never saw.

Part of the remote half: standard library only; the tokenizer is passed in.
"""

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from potato.training.escaping import escaped

PLACEHOLDERS = ("text", "labels", "description")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

DEFAULT_TEMPLATES = {
    "nominal": "{description}\n\nText: {text}\n\nAnswer with one of: {labels}.",
    "ordinal": "{description}\n\nText: {text}\n\nAnswer with one of: {labels}.",
    "multilabel": "{description}\n\nText: {text}\n\nFor each of these labels, say yes or no: {labels}.",
    "text": "{description}\n\nText: {text}",
    # The prompt the two responses answer, as it is: the annotators' question is theirs, not the model's.
    "comparison": "{text}",
}
YES, NO = " yes", " no"


class PromptTooLong(Exception):
    """The prompt leaves no room for the item's text within ``max_length``: ``tokens`` is the prompt's
    length with the text cut as far as it went, ``room`` what had to hold it."""

    def __init__(self, tokens: int, room: int):
        super().__init__(tokens, room)
        self.tokens, self.room = tokens, room


def template_problems(template: Any) -> List[str]:
    """What is wrong with a ``prompt_template`` option (empty when nothing is)."""
    if not isinstance(template, str) or not template.strip():
        return ["prompt_template must be a non-empty string with {{text}} in it, got {!r}".format(template)]
    problems = []
    unknown = sorted({name for name in _PLACEHOLDER.findall(template) if name not in PLACEHOLDERS})
    if unknown:
        problems.append("prompt_template has {}, which {} not a placeholder; the placeholders are {}".format(
            ", ".join("{" + name + "}" for name in unknown), "is" if len(unknown) == 1 else "are",
            ", ".join("{" + name + "}" for name in PLACEHOLDERS)))
    if "{text}" not in template:
        problems.append("prompt_template must contain {text}, where the item's text goes")
    return problems


def fill(template: str, text: str, labels: Sequence[str], description: str) -> str:
    """``template`` with its placeholders filled; the blank lines an empty description leaves are dropped."""
    values = {"text": text, "labels": ", ".join(labels), "description": description.strip()}
    filled = _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)
    return filled.strip("\n") if not values["description"] else filled


class PromptFormat:
    """How one tokenizer turns prompts and answers into token ids.

    ``end``: the ids that close an answer; ``stops``: the ids that end a
    generated one (the end-of-sequence tokens and the chat template's end of
    turn).
    """

    def __init__(self, tokenizer: Any, eos_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        eos = [i for i in eos_ids if isinstance(i, int)] or (
            [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.end = self._chat_turn_end() if self.chat else None
        if not self.end:
            if not eos:
                raise ValueError("the tokenizer has no end-of-sequence token and no chat template")
            self.end = [eos[0]]
        self.stops = frozenset(eos) | {self.end[0]}

    def _render(self, messages: List[Dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _chat_turn_end(self) -> Optional[List[int]]:
        """The tokens the chat template puts after an assistant's answer, or None when it cannot be told."""
        mark = "\x00answer\x00"
        try:
            prompt = self._render([{"role": "user", "content": "x"}], True)
            full = self._render([{"role": "user", "content": "x"}, {"role": "assistant", "content": mark}], False)
        except Exception:  # a template that wants other roles or arguments
            return None
        if not full.startswith(prompt) or not full[len(prompt):].startswith(mark):
            return None  # the template adds something before the answer (a thinking block): not ours to mimic
        tail = full[len(prompt) + len(mark):]
        return self.encode(tail) or None

    def encode(self, text: str) -> List[int]:
        """``text``'s ids with no special tokens added."""
        return list(self.tokenizer(escaped(text), add_special_tokens=False)["input_ids"])

    def prompt(self, content: str) -> List[int]:
        """The ids of a prompt whose user content is ``content``, up to where the answer starts."""
        return self.prompts([content])[0]

    def prompts(self, contents: Sequence[str]) -> List[List[int]]:
        """:meth:`prompt` of each of ``contents``, tokenized in one call (a prediction batch's)."""
        # An item's text may hold what UTF-8 cannot encode (a lone surrogate from a JSON file), which the
        # tokenizer refuses: such characters are tokenized as their escapes.
        contents = [escaped(c) for c in contents]
        if self.chat:
            texts = [self._render([{"role": "user", "content": c}], True) for c in contents]
            return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        # BOS where the tokenizer adds one
        return [list(ids) for ids in self.tokenizer([c + "\n" for c in contents])["input_ids"]]

    def fit_prompt(self, template: str, text: str, labels: Sequence[str], description: str,
                   room: int) -> Tuple[List[int], bool]:
        """``(prompt ids, whether the text was cut)``: the item's text cut until the prompt is ``room`` long at most.

        Raises :class:`PromptTooLong` when the prompt without any text is
        already longer than ``room``.
        """
        return self.fit_filled(self.prompt(fill(template, text, labels, description)), template, text, labels,
                               description, room)

    def fit_filled(self, ids: List[int], template: str, text: str, labels: Sequence[str], description: str,
                   room: int) -> Tuple[List[int], bool]:
        """:meth:`fit_prompt` for a prompt already tokenized as ``ids``."""
        if len(ids) <= room:
            return ids, False
        text_ids = self.encode(text)
        for _ in range(4):  # a cut text may tokenize a little differently inside the prompt: cut again
            keep = len(text_ids) - (len(ids) - room)
            if keep <= 0:  # even with no text at all the prompt is too long: its length without the text
                raise PromptTooLong(len(ids) - len(text_ids), room)
            text_ids = text_ids[:keep]
            ids = self.prompt(fill(template, self.tokenizer.decode(text_ids), labels, description))
            if len(ids) <= room:
                return ids, True
        raise PromptTooLong(len(ids), room)


class AnswerTokens:
    """A schema's answers as token pieces: what to train on, what to score or generate.

    ``kind``: nominal, ordinal, multilabel or text. ``labels``: the schema's
    labels (none for text).
    """

    def __init__(self, fmt: PromptFormat, kind: str, labels: Sequence[str]):
        self.fmt, self.kind, self.labels = fmt, kind, list(labels)
        # nominal/ordinal: each label's tokens, then the first end token (where scoring stops:
        # what follows the end of a turn is fixed, and a label that is a prefix of another differs there)
        self.choices = [fmt.encode(label) + fmt.end[:1] for label in self.labels] if kind != "multilabel" else []
        # multilabel: the line head before each decision, and the decisions' tokens
        self.heads = [fmt.encode(("\n" if k else "") + label + ":") for k, label in enumerate(self.labels)]
        self.decisions = (fmt.encode(YES), fmt.encode(NO))

    def target(self, answer: Any, limit: Optional[int] = None) -> List[int]:
        """The ids to train on for ``answer`` (a label, a list of labels, or a text).

        ``limit``: the most ids a text answer keeps (cut answers lose their end).
        """
        if self.kind == "text":
            ids = self.fmt.encode(str(answer)) + self.fmt.end
            return ids if limit is None or len(ids) <= limit else ids[:limit]
        if self.kind == "multilabel":
            chosen = set(answer)
            ids = []  # type: List[int]
            for head, label in zip(self.heads, self.labels):
                ids += head + self.decisions[0 if label in chosen else 1]
            return ids + self.fmt.end
        return self.fmt.encode(str(answer)) + self.fmt.end

    def longest(self, max_new_tokens: int) -> int:
        """The most ids an answer of this schema takes (for a text schema: ``max_new_tokens`` and the end)."""
        if self.kind == "text":
            return max_new_tokens + len(self.fmt.end)
        if self.kind == "multilabel":
            return sum(len(h) for h in self.heads) + len(self.labels) * max(map(len, self.decisions)) + len(self.fmt.end)
        return max(len(c) for c in self.choices) + len(self.fmt.end) - 1
