"""Scores and values in words and Markdown, one wording for the CLI, the pages, model cards and Prefect.

- ``score_text``     one schema's holdout scores in words
- ``markdown_text``  values from a config or a run as Markdown that renders as written
"""
