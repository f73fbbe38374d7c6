"""The llama.cpp runtime: one GGUF model and context, driven through llama-cpp-python's low-level
API, with the native eval callback that captures keys and adds the steering direction.

Layer: above the base (``errors``, ``streams``, ``native``) only. ``engine`` owns the llama.cpp
handles; ``key_pass`` runs key-only passes on them; ``contexts`` makes sibling contexts and the
Q8_0 twin; ``lm_head`` holds the LM head's row kernels; ``gguf_model`` reads a GGUF's metadata and
LM head; ``abi`` checks that the extension was built against the ggml that is loaded;
``default_model`` finds the embedded Gemma-3-270M; ``fingerprint`` identifies a model file.
"""
