"""The memory: prototypes and anchors (the bank), the byte budget and its repair, the codecs
that shrink keys and directions, and the atomic, memory-mapped store that persists them.

Layer: above the base only; it knows nothing of llama.cpp. ``bank`` holds eqs. 3-5 (write,
merge, prune, evict), with ``prototype`` (its settings and unit), ``bank_view`` (what retrieval
reads) and ``bank_arrays`` (its stored form); ``budget`` parses and resolves budgets; ``codecs``
packs arrays; ``store`` is the versioned directory and its transactions, ``store_format`` its file
format (2; ``store_format_v1`` reads the older one), ``meta`` a memory's own fields in their
compact stored form and ``manifest`` those fields as a value, checked before they are read.
"""
