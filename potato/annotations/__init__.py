"""The annotators' answers as Potato 2.12 saves them, and one answer per item from several annotators.

- ``labels``             the ``user_state.json`` files, the label votes in them, one label per item
- ``annotator_answers``  answers that are not label votes: numbers, free text, spans, and who answered each item
- ``aggregation``        one answer per item and schema from several annotators', per kind of answer
- ``consensus``          Dawid-Skene consensus, weighing each annotator by reliability
- ``json_chunks``        a very large JSON object walked in chunks; ``forked``: a function in a forked child
"""
