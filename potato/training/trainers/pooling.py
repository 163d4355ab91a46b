"""A classifier on the mean of an encoder's token states, for models trained to be read that way.

``transformers``' sequence classifiers read a text through its first token
(BERT: ``[CLS]`` through a dense layer, its "pooler"). A sentence-embedding
model — the shipped MiniLM is one — was trained to be read through the mean
of its token states instead, and its pooler was never trained: logistic
regression on the frozen MiniLM scored 0.711 on SST-2's dev set with 100
training labels on the mean of its token states, 0.615 on its ``[CLS]`` state
and 0.508 (chance) on its pooler's output; with 500 labels 0.740, 0.679 and
0.632 (scikit-learn's defaults, one draw of sentences of six words or more).
A fine-tune that starts from the
pooler starts from nothing, and on a few hundred answers loses to the frozen
encoder it started from. So a model directory that says it is read by the
mean (sentence-transformers' ``1_Pooling/config.json``:
``pooling_mode_mean_tokens``) gets a classifier on the mean, and its head
starts as the linear probe — logistic regression (or the head's own loss) on
the frozen mean — before the encoder is fine-tuned under it (LP-FT: Kumar et
al., ICLR 2022, "Fine-Tuning can Distort Pretrained Features").

Option ``pooling``: ``auto`` (the default: ``mean`` where the model says so,
else ``cls``), ``mean``, ``cls``.

What is saved for ``mean``: the encoder as ``save_pretrained`` writes it
(``AutoModel`` loads it; with the model's ``modules.json`` and
``1_Pooling/`` beside it, sentence-transformers loads it as an embedding
model too), or its LoRA adapter; and the head, ``classifier.safetensors``
(``weight``, ``bias``), read by :func:`load_classifier` or ten lines of
torch (the model card shows them).

Part of the remote half: importing this module loads only the standard
library; torch, transformers and safetensors are passed in or imported inside functions.
"""

import json
import os
import shutil
from typing import Any, Dict, List, Optional

POOLINGS = ("auto", "mean", "cls")
HEAD_FILE = "classifier.safetensors"
# The files of a sentence-transformers model that say how it pools: copied beside a full fine-tune's encoder.
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                               "1_Pooling")
# The linear probe: L2 strength as scikit-learn's LogisticRegression's default C=1 (summed loss + |w|^2/2), and
# the most L-BFGS iterations.
PROBE_C = 1.0
PROBE_ITERATIONS = 200


def declared_pooling(model_dir: str) -> str:
    """``mean`` when the model directory says it is read by the mean of its token states, else ``cls``."""
    try:
        with open(os.path.join(model_dir, "1_Pooling", "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return "cls"
    return "mean" if isinstance(config, dict) and config.get("pooling_mode_mean_tokens") is True else "cls"


def pooling_of(option: str, model_dir: str) -> str:
    return declared_pooling(model_dir) if option == "auto" else option


def mean_of(torch: Any, hidden: Any, mask: Any) -> Any:
    """The mean of each row's token states over its real tokens (``mask`` 1), as sentence-transformers pools."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def mean_pooled_classifier(torch: Any, encoder: Any, num_labels: int) -> Any:
    """A ``torch.nn.Module``: ``encoder`` (an ``AutoModel``), the mean of its token states, one linear layer.

    Called as a transformers classifier is (``input_ids``, ``attention_mask``)
    and answering as one does (an object with ``.logits``), so the training
    loop, prediction and the ONNX export take it as they take any classifier.
    """
    from transformers.modeling_outputs import SequenceClassifierOutput

    class MeanPooledClassifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder
            self.classifier = torch.nn.Linear(encoder.config.hidden_size, num_labels)
            self.config = encoder.config
            self.mean_pooled = True
            # What the ONNX export asks of a model: a LoRA merged for it, attention written out for it.
            for name in ("merge_adapter", "unmerge_adapter", "set_attn_implementation"):
                if hasattr(encoder, name):
                    setattr(self, name, getattr(encoder, name))

        def features(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return mean_of(torch, hidden, attention_mask)

        def forward(self, input_ids: Any = None, attention_mask: Any = None, **_: Any) -> Any:
            return SequenceClassifierOutput(logits=self.classifier(self.features(input_ids, attention_mask)))

    return MeanPooledClassifier()


def encoder_of(model: Any) -> Optional[Any]:
    """The encoder under a mean-pooled classifier (:func:`mean_pooled_classifier`), None for any other model."""
    return getattr(model, "encoder", None) if getattr(model, "mean_pooled", False) else None


def fit_probe(torch: Any, features: Any, targets: Any, loss: Any, classifier: Any) -> None:
    """Set ``classifier`` (a ``Linear``) to the linear probe on ``features``: the head's summed ``loss`` plus
    ``|weight|^2 / (2 C)`` (scikit-learn's LogisticRegression at its default C), minimised by L-BFGS."""
    weight = torch.zeros_like(classifier.weight, requires_grad=True)
    bias = torch.zeros_like(classifier.bias, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=PROBE_ITERATIONS, line_search_fn="strong_wolfe")
    features = features.detach().float()

    def closure() -> Any:
        optimizer.zero_grad()
        value = loss(torch, features @ weight.T + bias, targets) + (weight ** 2).sum() / (2 * PROBE_C)
        value.backward()
        return value

    optimizer.step(closure)
    with torch.no_grad():
        classifier.weight.copy_(weight)
        classifier.bias.copy_(bias)


def save_classifier(model: Any, out_dir: str, base_dir: str, lora: bool) -> None:
    """Save a mean-pooled classifier into ``out_dir`` (module docstring): the encoder (or its adapter), its
    pooling files for a full fine-tune, and the head."""
    from safetensors.torch import save_file

    model.encoder.save_pretrained(out_dir)
    if not lora:
        for name in SENTENCE_TRANSFORMERS_FILES:
            source = os.path.join(base_dir, name)
            target = os.path.join(out_dir, name)
            if os.path.isdir(source):
                shutil.copytree(source, target, dirs_exist_ok=True)
            elif os.path.isfile(source):
                shutil.copyfile(source, target)
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.classifier.state_dict().items()}
    save_file(state, os.path.join(out_dir, HEAD_FILE))


def load_classifier(torch: Any, model_dir: str, encoder: Any) -> Any:
    """The mean-pooled classifier saved in ``model_dir``, on ``encoder`` (``AutoModel.from_pretrained`` of it,
    or its base with the adapter)."""
    from safetensors.torch import load_file

    state = load_file(os.path.join(model_dir, HEAD_FILE))
    model = mean_pooled_classifier(torch, encoder, state["weight"].shape[0])
    model.classifier.load_state_dict(state)
    return model


def usage_lines(where: str, sub: str, base_model: Optional[str], lora: bool, labels: List[str]) -> List[str]:
    """How the model card loads a mean-pooled classifier (plain torch and transformers)."""
    if lora:
        load = ["from peft import PeftModel",
                f'encoder = PeftModel.from_pretrained(AutoModel.from_pretrained("{base_model or "<base model>"}"), '
                f'"{where}"{sub})']
    else:
        load = [f'encoder = AutoModel.from_pretrained("{where}"{sub})']
    return [
        "import torch",
        "from huggingface_hub import hf_hub_download",
        "from safetensors.torch import load_file",
        "from transformers import AutoModel, AutoTokenizer",
        "",
        *load,
        f'tokenizer = AutoTokenizer.from_pretrained("{where}"{sub})',
        f'head = load_file(hf_hub_download("{where}", "{HEAD_FILE}"{sub}))  # or the file in this folder',
        f"labels = {json.dumps(list(labels), ensure_ascii=False)}",
        "",
        "def classify(texts):",
        "    batch = tokenizer(texts, padding=True, truncation=True, return_tensors=\"pt\")",
        "    with torch.no_grad():",
        "        hidden = encoder(**batch).last_hidden_state",
        "    mask = batch[\"attention_mask\"].unsqueeze(-1).float()",
        "    mean = (hidden * mask).sum(1) / mask.sum(1)  # the mean of the token states, as it was trained",
        "    probs = torch.softmax(mean @ head[\"weight\"].T + head[\"bias\"], dim=-1)",
        "    return [labels[i] for i in probs.argmax(-1)]",
    ]


def describe(pooling: str, option: str) -> str:
    """The model line's word for it."""
    if pooling == "mean":
        return "mean of token states" + (" (the model says so)" if option == "auto" else "")
    return "first token"


def options_problems(options: Dict[str, Any]) -> List[str]:
    if "pooling" in options and options["pooling"] not in POOLINGS:
        return ["pooling must be auto, mean or cls, got {!r}".format(options["pooling"])]
    return []
