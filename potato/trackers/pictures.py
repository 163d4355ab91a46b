"""A label schema's confusion matrix and reliability diagram as SVG, for a tracker's artifacts.

The run page draws the same two pictures in the browser from the holdout
evaluation (``potato.results.evaluation``); a tracker keeps files, so these are
drawn here, by hand: no plotting library on the annotation server. Every
label is escaped as XML text, a lone surrogate as its ``\\udXXX`` escape.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence
from xml.sax.saxutils import escape

from potato.training.escaping import escaped

CELL, MARGIN, SIDE = 48, 110, 240


def _svg(width: int, height: int, title: str, body: list[str]) -> str:
    # Always UTF-8: a lone surrogate in a label becomes its escape.
    return escaped(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                   f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">'
                   f"<title>{escape(title)}</title>" + "".join(body) + "</svg>\n")


def confusion_svg(schema: str, labels: Sequence[str], confusion: Sequence[Sequence[int]]) -> str:
    """Rows: the annotators' label; columns: the model's; darker is more items."""
    most = max([1, *(n for row in confusion for n in row)])
    size = MARGIN + CELL * len(labels)
    body = [f'<text x="{MARGIN}" y="14">model says →</text>',
            f'<text x="4" y="{MARGIN - 6}">annotators ↓</text>']
    for j, label in enumerate(labels):
        body.append(f'<text x="{MARGIN + CELL * j + 4}" y="{MARGIN - 24}">{escape(str(label)[:8])}</text>')
    for i, (label, row) in enumerate(zip(labels, confusion)):
        y = MARGIN + CELL * i
        body.append(f'<text x="4" y="{y + CELL // 2 + 4}">{escape(str(label)[:14])}</text>')
        for j, n in enumerate(row):
            x, shade = MARGIN + CELL * j, round(235 - 190 * n / most)
            body.append(f'<rect x="{x}" y="{y}" width="{CELL - 2}" height="{CELL - 2}" '
                        f'fill="rgb({shade},{shade + 10},255)"/>'
                        f'<text x="{x + CELL // 2 - 8}" y="{y + CELL // 2 + 4}">{int(n)}</text>')
    return _svg(size + 10, size + 10, f"Confusion matrix of {schema}", body)


def reliability_svg(schema: str, bins: Sequence[Mapping[str, Any]], ece: float | None) -> str:
    """Each bin's accuracy against its confidence; the diagonal is a perfectly calibrated model."""
    left, top = 40, 20
    body = [f'<rect x="{left}" y="{top}" width="{SIDE}" height="{SIDE}" fill="none" stroke="#888"/>',
            f'<line x1="{left}" y1="{top + SIDE}" x2="{left + SIDE}" y2="{top}" stroke="#888" '
            'stroke-dasharray="4 3"/>',
            f'<text x="{left}" y="{top + SIDE + 18}">confidence</text>',
            f'<text x="4" y="{top + 10}">accuracy</text>']
    for b in bins:
        if not b.get("n") or b.get("accuracy") is None:
            continue
        x, width = left + SIDE * float(b["lo"]), SIDE * (float(b["hi"]) - float(b["lo"]))
        height = SIDE * float(b["accuracy"])
        body.append(f'<rect x="{x:.1f}" y="{top + SIDE - height:.1f}" width="{width - 1:.1f}" '
                    f'height="{height:.1f}" fill="#7d9cc0"/>')
    if ece is not None:
        body.append(f'<text x="{left + 6}" y="{top + 16}">ECE {ece:.3f}</text>')
    return _svg(left + SIDE + 10, top + SIDE + 30, f"Reliability diagram of {schema}", body)


def of_schema(schema: str, shown: Any) -> dict[str, str]:
    """``{file name: SVG}`` of one schema's holdout evaluation: both pictures for a label schema, else none."""
    if not isinstance(shown, dict) or not isinstance(shown.get("confusion"), list):
        return {}
    labels = [str(label) for label in shown.get("labels") or []]
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in schema) or "schema"
    out = {f"{safe}-confusion.svg": confusion_svg(schema, labels, shown["confusion"])}
    if isinstance(shown.get("reliability"), list):
        out[f"{safe}-reliability.svg"] = reliability_svg(schema, shown["reliability"], shown.get("ece"))
    return out
