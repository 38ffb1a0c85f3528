"""The baselines' own releases as families: timm's ViT and transformers' GPT-2 (names as their hubs hold them)."""

from __future__ import annotations

from .families import Family

PEERS: tuple[Family, ...] = ()
