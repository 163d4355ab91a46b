"""Local device choice for Potato 2.12's ``device: gpu`` (this machine has no GPU)."""

from __future__ import annotations

from potato.training.device import choose_device, describe_local_device


def test_gpu_without_a_gpu_trains_on_the_cpu_with_a_warning():
    choice = choose_device("gpu", num_threads=2)
    assert (choice.device, choice.name) == ("cpu", "CPU (2 threads)")
    assert choice.warning == ("The requested device 'gpu' is not available (this machine has no GPU torch "
                              "can use); training on CPU (2 threads) instead")
    assert describe_local_device("gpu", num_threads=2) == (
        "CPU (2 threads) (device 'gpu' is not available: this machine has no GPU torch can use)")
    assert choose_device("auto", num_threads=2).warning is None
