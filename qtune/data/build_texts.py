"""Rebuild the shipped texts of this folder from CPython's own documentation
(``pydoc_data/topics.py`` of the running Python; the files were made with
3.11.7): ``python -m qtune.data.build_texts``.

Only prose paragraphs are kept (no indented code or grammar, at least 85%
letters and spaces, at least 200 characters), each on one line.  Which
topics feed which file is fixed below, so the three sets share no paragraph.
See README.md in this folder for the licence.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).parent
# Prose about Python's execution model: about 3,000 tokens of English.
EVAL_TOPICS = ("execmodel", "objects", "exceptions")
# Opening words of every third paragraph (neighbours repeat their openings),
# continued greedily by the model.
GREEDY_TOPIC = "types"
GREEDY_PROMPTS = 16
GREEDY_WORDS = 24
# The real-text workload: instructions over paragraphs of other topics.
WORKLOAD_TOPICS = ("compound", "specialnames", "formatstrings", "attribute-access",
                   "assignment", "import", "calls", "comparisons", "try", "function")
WORKLOAD_PROMPTS = 64
WORKLOAD_OUTPUT_TOKENS = 64
_ASKS = ("Summarize the following passage in two sentences.",
         "Explain the following passage to a new Python programmer.",
         "List the main points of the following passage.",
         "Rewrite the following passage in plain English.")
PASSAGE_CHARS = 1800  # about 400 tokens: fits any context qtune serves


def paragraphs(topic: str) -> list[str]:
    from pydoc_data.topics import topics

    out = []
    for p in re.split(r"\n\s*\n", topics[topic]):
        if not p.strip() or p.startswith((" ", "\t")):
            continue
        p = " ".join(p.split())
        if len(p) >= 200 and sum(c.isalpha() or c == " " for c in p) / len(p) >= 0.85:
            out.append(p)
    return out


def passages(paras: list[str]) -> list[str]:
    """Paragraphs joined up to ``PASSAGE_CHARS`` each (a longer paragraph is
    a passage of its own)."""
    out: list[str] = []
    for p in paras:
        if out and len(out[-1]) + 2 + len(p) <= PASSAGE_CHARS:
            out[-1] += "\n\n" + p
        else:
            out.append(p)
    return out


def main() -> None:
    import sys

    source = (f"CPython {sys.version.split()[0]} documentation, "
              "Lib/pydoc_data/topics.py")
    licence = ("PSF License Agreement; Copyright (c) 2001 Python Software Foundation; "
               "All Rights Reserved")
    evals = passages([p for t in EVAL_TOPICS for p in paragraphs(t)])
    greedy = [" ".join(p.split()[:GREEDY_WORDS])
              for p in paragraphs(GREEDY_TOPIC)[::3][:GREEDY_PROMPTS]]
    quality = {"source": source, "licence": licence, "topics": {
        "eval": list(EVAL_TOPICS), "greedy": GREEDY_TOPIC},
        "eval_passages": evals, "greedy_prompts": greedy}
    (HERE / "quality.json").write_text(json.dumps(quality, indent=1, ensure_ascii=False)
                                       + "\n", encoding="utf-8")
    paras = [p for t in WORKLOAD_TOPICS for p in paragraphs(t)][:WORKLOAD_PROMPTS]
    lines = [json.dumps({"prompt": f"{_ASKS[i % len(_ASKS)]}\n\n{p}\n\n",
                         "output_tokens": WORKLOAD_OUTPUT_TOKENS}, ensure_ascii=False)
             for i, p in enumerate(paras)]
    (HERE / "python-docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
