"""The text side of the engines with real tokenizers (torch and vLLM): prompts as token
ids (``side.TextSide``), the PRM's input formats (``prm_format``) and per-step pieces
(``prm_paths``, ``prm_rows``), vocabulary facts (``vocabulary``), tokenizer loading
(``tokenizer``). Never touches tensors."""
