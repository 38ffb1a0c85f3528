"""What every tokenizer kind shares and GPT-2's vocabulary is checked against, with no tokenizer behind it: the five
special tokens and GPT-2's byte-level alphabet (``bytes_to_unicode`` of GPT-2's ``encoder.py``)."""

from __future__ import annotations

import functools

__all__ = ["SPECIALS", "byte_level_bytes"]

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@functools.lru_cache(maxsize=1)
def byte_level_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table
