"""Written answers against the model answer: how much of it an answer holds, word for word and in order, so that
``answers.html`` flags a copy for the instructor (:mod:`.answers`). Prose, not code: :mod:`.similarity` compares
code.
"""

from __future__ import annotations

import re

# a written answer holding this share of the model answer's words, in order, is the model answer with a few words
# changed: an honest answer four times as long as a lab's model answer held at most 40 % of it (measured over the
# labs' 31 explain questions, each against the others' model answers)
COPIED = 0.8
# below this many words a model answer is flagged only when copied whole: 4 of 5 words in order happen by chance
MIN_MODEL_WORDS = 12


def words(text: str) -> list[str]:
    """A text's words in lower case, punctuation, markup and spacing gone: what two written answers are compared by."""
    return re.findall(r"[^\W_]+", text.lower())


def in_order(model: list[str], answer: list[str]) -> int:
    """How many of ``model``'s words ``answer`` holds in the same order: their longest common subsequence, by Hyyrö's
    bit-parallel recurrence (one big-integer step per word of ``answer``, so a class of answers costs milliseconds)."""
    masks: dict[str, int] = {}
    for i, word in enumerate(model):
        masks[word] = masks.get(word, 0) | 1 << i
    full = (1 << len(model)) - 1
    v = full  # its zero bits count the model's words matched so far
    for word in answer:
        u = v & masks.get(word, 0)
        v = ((v + u) | (v - u)) & full
    return len(model) - v.bit_count()


def copied_share(model: str, answer: str) -> float:
    """The share of the model answer's words that ``answer`` holds in order, when that makes it a copy (1.0: word for
    word, case, spacing and punctuation aside; :data:`COPIED` or more of a model answer of :data:`MIN_MODEL_WORDS`
    words or more); else 0.0."""
    theirs, mine = words(model), words(answer)
    if not theirs or not mine:
        return 0.0
    if mine == theirs:
        return 1.0
    if len(theirs) < MIN_MODEL_WORDS:
        return 0.0
    share = in_order(theirs, mine) / len(theirs)
    return share if share >= COPIED else 0.0
