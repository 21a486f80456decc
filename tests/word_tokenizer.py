"""A small tokenizer.json made on the spot (nothing downloaded): one word per token id."""

from __future__ import annotations

import json
from pathlib import Path


def word_tokenizer(directory: Path, size: int) -> Path:
    """`tokenizer.json` (and the `tokenizer_config.json` transformers reads) in `directory`:
    id 0 is [UNK], id i the word `w<i>`; words split on whitespace and join with spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return path
