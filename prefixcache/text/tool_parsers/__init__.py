"""Tool-call parsers: a model's generated text -> content and OpenAI-style tool calls.

One module per syntax (:mod:`.hermes`, :mod:`.llama3_json`, :mod:`.mistral`), the shared
types and partial-JSON helpers in :mod:`.base`, the name -> parser table and the
detection from a chat template in :mod:`.registry`, and the incremental (streaming)
driver in :mod:`.streaming`. Import the submodules directly.
"""
