"""What happens after a run trained: its results recorded and what annotators see, one module a job.

- ``record_results``       the flow's record-results step: scores, evaluation, gate, stability, writeback
- ``evaluation``           the holdout evaluation the run page draws (confusion, reliability)
- ``quality_gate``         a schema no better than the trivial baseline or the live run is not written back
- ``writeback``            predictions into the annotation output annotators see, and what was written
- ``live_writeback``       the same, live, into the items' own data files (while Potato 2.12 serves them)
- ``cold_start_writeback`` the first batch's order, before any model
- ``promote``              a held-back run made live; a run pinned
- ``retract``              a run's predictions taken back out
- ``stability``            the stopping signal: predicted labels changed since the previous run
- ``retention``            old runs' large files removed
- ``run_report``           the run's report as Prefect artifacts show it
"""
