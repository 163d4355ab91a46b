"""Trainers: the code that turns a run bundle into a model and predictions.

Part of the remote half (copied to GPU hosts): stdlib only at import time;
each trainer imports its ML packages lazily, inside its functions. Which
trainers there are, and what each trains and needs, is declared in
``potato.training.trainers.registry``.
"""
