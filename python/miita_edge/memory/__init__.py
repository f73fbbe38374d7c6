"""The memory: prototypes and anchors (the bank), the byte budget and its repair, the codecs
that shrink keys and directions, and the atomic, memory-mapped store that persists them.

Layer: above the base only; it knows nothing of llama.cpp. ``bank`` holds eqs. 3-5 (write,
merge, prune, evict); ``budget`` parses and resolves budgets; ``codecs`` packs arrays;
``store`` and ``store_format`` are the versioned directory and its file format.
"""
