"""Scoring models: one home for every number `lamina eval` and a run's validation report.

    choice.py      multiple-choice log-likelihood as lm-evaluation-harness scores it: acc,
                   acc_norm, their standard errors (the context run once per item, choices
                   batched)
    perplexity.py  next-token loss over any text with a sliding window: per token, per
                   character, bits per byte; a whole split's loss (what validation reports)
    tasks.py       the task file format (JSONL: context / query, choices, gold; or text)
    builtin_tasks.py  built-in tasks from the Shakespeare corpus: next-line, which-play
    classifier_scores.py  classifier metrics: confusion matrix, accuracy, macro-F1, per class

Every function takes a model and a tokenizer (or token ids); nothing here opens a model file,
parses a command line or knows about optimizers.
"""
