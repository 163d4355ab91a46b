"""SLURM builders and parsers (potato/training/slurm.py), against output recorded from the real tools."""

from __future__ import annotations

import subprocess

import pytest

from potato.training.slurm import (
    SlurmCommandError, describe_queue_state, explain_end, make_job_script, make_sbatch_flags, parse_sbatch,
    parse_scontrol, parse_squeue,
)


def test_sbatch_flags_map_the_backend_keys():
    config = {"partition": "gpu", "gres": "gpu:1", "time": "04:00:00", "cpus_per_task": 8, "mem": "16G",
              "account": None, "prelude": ["module load cuda/12.4"]}
    assert make_sbatch_flags(config) == ["--partition=gpu", "--gres=gpu:1", "--time=04:00:00", "--mem=16G",
                                         "--cpus-per-task=8"]


def test_job_script_quotes_every_word_and_execs_the_worker(tmp_path):
    job_dir = str(tmp_path / "a 0'; echo foo")
    script = make_job_script({"job_python": "/shared/envs/train/bin/python", "prelude": ["module load cuda/12.4"],
                              "code_dir": "/shared/code/abc", "gres": "gpu:1"}, job_dir, 7)
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash" and "#SBATCH --job-name=potato-run-7" in lines
    assert "#SBATCH --no-requeue" in lines and "#SBATCH --gres=gpu:1" in lines
    assert lines.index("module load cuda/12.4") < len(lines) - 1
    assert lines[-1].startswith("exec /shared/envs/train/bin/python -m potato.training.worker ")
    # The hostile directory survives the shell as one word.
    (tmp_path / "a 0'; echo foo").mkdir()
    probe = script.replace("exec /shared/envs/train/bin/python -m potato.training.worker", "printf '%s\\n'")
    probe = probe.replace("module load cuda/12.4", ":")
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True)
    assert done.stdout.splitlines() == [job_dir]


@pytest.mark.parametrize("key, value", [("partition", "gpu\ntouch /tmp/owned"), ("prelude", ["ok", "x\ry"]),
                                        ("job_python", "/py\n"), ("gres", "gpu:1\x00")])
def test_job_script_refuses_a_control_character_in_any_value(tmp_path, key, value):
    """A hand-started agent's --slurm-config is seen by no validation."""
    config = {"job_python": "/shared/envs/train/bin/python", key: value}
    with pytest.raises(ValueError, match=r"The slurm setting (prelude\[1\]|{}) is .*: it holds a control "
                       r"character, which would break job\.sh into shell lines of its own; remove it".format(key)):
        make_job_script(config, str(tmp_path), 7)


@pytest.mark.parametrize("output, expected", [("4242\n", "4242"), ("4242;cluster\n", "4242")])
def test_parse_sbatch(output, expected):
    assert parse_sbatch(output) == expected


def test_parse_sbatch_quotes_what_it_cannot_read():
    with pytest.raises(SlurmCommandError, match="Could not make sense of sbatch output 'Submitted batch job 1'"):
        parse_sbatch("Submitted batch job 1\n")


@pytest.mark.parametrize("output, expected, text", [
    ("PENDING|Priority|\n", ("PENDING", "Priority", ""), "SLURM job 4242: PENDING (Priority)"),
    ("PENDING|None|\n", ("PENDING", "None", ""), "SLURM job 4242: PENDING"),
    ("RUNNING|None|node07\n", ("RUNNING", "None", "node07"), "SLURM job 4242: RUNNING on node07"),
    ("COMPLETING|TimeLimit|node07\n", ("COMPLETING", "TimeLimit", "node07"), "SLURM job 4242: COMPLETING (TimeLimit)"),
])
def test_parse_squeue(output, expected, text):
    assert parse_squeue(output) == expected
    assert describe_queue_state("4242", *expected) == text


def test_a_job_gone_from_squeue_is_none():
    assert parse_squeue("") is None


SCONTROL = ("JobId=28 JobName=potato-run-1\n   UserId=potatotest(1001) GroupId=potatotest(1001)\n"
            "   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)\n   ExitCode=0:15\n")


@pytest.mark.parametrize("scontrol, slurm_out, reason", [
    (SCONTROL, "", "it reached its time limit"),
    ({"JobState": "COMPLETING", "Reason": "TimeLimit"}, "", "it reached its time limit"),
    (None, "slurmstepd-node07: error: *** JOB 28 ON node07 CANCELLED AT 2026-11-29T10:00:00 DUE TO TIME LIMIT ***",
     "it reached its time limit"),
    ({"JobState": "NODE_FAIL", "Reason": "NodeDown"}, "", "its node failed"),
    ({"JobState": "PREEMPTED"}, "", "it was preempted by a job of higher priority"),
    ({"JobState": "OUT_OF_MEMORY"}, "", "it ran out of memory (raise the backend's mem)"),
    ({"JobState": "CANCELLED"}, "", "it was cancelled with scancel outside Potato"),
    (None, "slurmstepd-node07: error: Detected 1 oom-kill event(s) in StepId=49.batch", "it ran out of memory (raise the backend's mem)"),
    (None, "", "it left the queue without a word in slurm.out"),
    # slurmstepd's own memory watch (JobAcctGatherParams=OverMemoryKill), recorded on the test SLURM 22.05:
    ({"JobState": "FAILED", "Reason": "JobLaunchFailure", "ExitCode": "0:9"},
     "slurmstepd-vm: error: StepId=1.batch exceeded memory limit (176005120 > 104857600), being killed\n"
     "slurmstepd-vm: error: *** JOB 1 ON vm CANCELLED AT 2026-11-30T21:44:30 ***\n"
     "slurmstepd-vm: error: Exceeded job memory limit\n", "it ran out of memory (raise the backend's mem)"),
    ({"JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "0:9"}, "", "its worker was killed by signal 9"),
    ({"JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "1:0"}, "",
     "its batch script failed (see slurm.out and stderr.log in the job directory)"),
])
def test_explain_end(scontrol, slurm_out, reason):
    fields = parse_scontrol(scontrol) if isinstance(scontrol, str) else scontrol
    assert explain_end(fields, slurm_out) == reason
