"""Character tokenizer shipped in the package: one token per character, no hub download.

Why characters: the synthetic tasks (``suite.embedded.tasks``) are short arithmetic traces and
terse word problems, so a fixed character vocabulary of ~80 symbols covers every string they
produce, keeps the embedding table of the tiny models negligible, and makes token counts equal
character counts, so a task's length budget in characters is its budget in tokens.

Ids: ``0 = <pad>``, ``1 = <bos>``, ``2 = <eos>``, then the characters of ``CHARS`` in order.
The vocabulary is fixed in code (never built from data), so a checkpoint's embedding rows keep
their meaning across runs and machines.

Sequence convention: a training or rollout sequence is ``encode(prompt) + encode(response) +
[<eos>]``, with no ``<bos>`` (the warm start, the trainer and the engines never add one;
``add_bos`` exists for callers that want it); the warm start appends the ``<eos>`` after the
response trace, and the rollout engine stops on ``eos_id``. A Hugging Face export of the model
must therefore render a prompt as its characters alone.
"""

from __future__ import annotations

import string
from collections.abc import Iterable

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS)  # ids 0, 1, 2; pad must be 0

# Every character any task may emit. "/" is the exact division of the word problems' sharing
# template; the rest are the punctuation of prompts and traces. Append only: reordering would
# change the ids of trained checkpoints.
CHARS: str = (
    string.digits
    + string.ascii_lowercase
    + string.ascii_uppercase
    + " +-*/=;#.,?'():\n"
)


class CharTokenizer:
    """Fixed character vocabulary plus ``<pad>`` (id 0), ``<bos>`` and ``<eos>``."""

    def __init__(self) -> None:
        self.itos: list[str] = list(SPECIAL_TOKENS) + list(CHARS)
        self.stoi: dict[str, int] = {ch: i for i, ch in enumerate(self.itos)}
        assert len(self.stoi) == len(self.itos), "duplicate symbol in the vocabulary"
        self.pad_id: int = self.stoi[PAD]
        self.bos_id: int = self.stoi[BOS]
        self.eos_id: int = self.stoi[EOS]
        self.special_ids: frozenset[int] = frozenset((self.pad_id, self.bos_id, self.eos_id))

    @property
    def vocab_size(self) -> int:
        """Number of token ids (specials included); the model's embedding rows."""
        return len(self.itos)

    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``text``, one per character; a character outside the vocabulary is an error.

        Special-token names in ``text`` (e.g. the literal ``"<eos>"``) are encoded as plain
        characters, never as the special id: only ``add_bos`` / ``add_eos`` insert specials.
        """
        ids = [self.bos_id] if add_bos else []
        for pos, ch in enumerate(text):
            try:
                ids.append(self.stoi[ch])
            except KeyError:
                raise ValueError(
                    f"character {ch!r} at position {pos} of {text!r} is not in the "
                    f"CharTokenizer vocabulary (allowed: {CHARS!r})"
                ) from None
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids`` (any iterable of ints, e.g. a 1-D tensor's ``tolist()``).

        With ``skip_special`` the pad/bos/eos ids are dropped; otherwise they are written as
        ``<pad>``, ``<bos>``, ``<eos>`` (``Task.verify`` ignores everything after ``<eos>``).
        Decoding does not stop at ``<eos>``: callers cut responses with the rollout's
        ``response_mask`` / ``response_len``.
        """
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.itos):
                raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self.itos)})")
            if skip_special and i in self.special_ids:
                continue
            out.append(self.itos[i])
        return "".join(out)
