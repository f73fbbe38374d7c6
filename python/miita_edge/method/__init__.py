"""The method: how examples become memories and memories become answers (paper §3).

Layer: above the runtime and the memory. ``templates`` render prompts; ``extract`` is eqs. 1-2;
``ingest`` runs a stream through extraction, the bank and its budget, ``key_extractors`` chooses
how its keys are extracted; ``calibration`` derives
the key-centring vector; ``retrieval`` (with ``vectors``, ``uncertainty``, ``scan_index``) is
eqs. 6-11; ``steering`` is the default preset's anchor vote and prefix-consistent aggregation;
``plan`` turns one query into a steering plan; ``presets`` names the settings.
"""
