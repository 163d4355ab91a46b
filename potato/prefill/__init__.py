"""What annotators see pre-filled, and the order Potato 2.12 serves the items in.

- ``prediction_shapes``  one line of a run's ``predictions.jsonl``, checked, for each kind of answer
- ``writeback_shapes``   a checked prediction in the shape Potato 2.12's annotate page pre-fills from
- ``review_order``       the order ``model_review`` serves items in, carried without misstating a confidence
"""
