"""Writes a Hugging Face tokenizer built here, never downloaded, for load generators
that insist on one: whitespace-separated words over a small vocabulary.

Run with the load generator's interpreter: `python local_tokenizer.py OUT_DIR`.
"""

from __future__ import annotations

import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def main(out: str) -> None:
    words = [f"w{i}" for i in range(4000)]
    vocab = {"[UNK]": 0, "[PAD]": 1, "[BOS]": 2, "[EOS]": 3}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()  # joins the words with spaces
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
    ).save_pretrained(out)


if __name__ == "__main__":
    main(sys.argv[1])
