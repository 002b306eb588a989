"""`llmplan ui`: a local web page over the library calls the CLI makes (a thin face: the
figures come from the same functions as `llmplan ... --json`)."""
