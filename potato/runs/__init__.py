"""The run lifecycle, one module a job.

- ``paths``       every file of a run directory (``RunPaths``) and the run store (``open_store``)
- ``queue``       create a run, checked against the config and the registries; cancel one
- ``dispatcher``  start queued runs FIFO, one at a time, each as a flow; reap the flows
- ``reconcile``   end the runs nobody drives any more (a dead or wedged flow)
- ``ending``      ``end_run``: the one way a run ends, once what it started is gone

The store (``potato.runs.store``) is the truth about runs; the flow
(``flows/training_run.py``) executes one.
"""
