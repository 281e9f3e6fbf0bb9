"""Experiments around the product, imported by bench/, tests/ and notebooks, never by monarch_nb:
the seed's swing experiment (``swing``), second faults during a recovery (``chaos``) and the
goodput cost model (``costmodel``)."""
