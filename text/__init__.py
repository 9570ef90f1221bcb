"""Text around the tokens: tokenizer and chat template, incremental detokenization, stop strings."""
