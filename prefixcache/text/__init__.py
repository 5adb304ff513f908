"""The text stack every package shares (DESIGN "Layout": one stack for every package).

- :mod:`.tokenizer`: the :class:`~.tokenizer.Tokenizer` protocol (text <-> token ids,
  offsets, special ids, chat rendering).
- Backends: :mod:`.hf_tokenizer` (transformers), :mod:`.json_tokenizer` (a
  ``tokenizer.json`` through the ``tokenizers`` library), :mod:`.byte_tokenizer` (one
  token per UTF-8 byte), :mod:`.approx_tokenizer` (file-free approximate counts).
- :mod:`.loading`: which backend a directory or a ``--tokenizer`` value gets;
  :mod:`.tokenizer_files`: a tokenizer folder's optional config files.
- :mod:`.chat_template`: Jinja chat templates rendered by transformers' own renderer,
  and the builtin ChatML template.
- :mod:`.detokenizer`: streaming token ids -> text deltas.
- :mod:`.tool_prompt`: tools and tool calls prepared for a chat template (the Hermes
  fallback for templates without tool syntax); :mod:`.tool_parsers`: generated text ->
  tool calls (Hermes, Llama 3 JSON, Mistral), streaming included.

Nothing here imports torch, ``prefixcache.model`` or any package above it. This
``__init__`` re-exports nothing: import the submodules.
"""
