"""GPU choice from nvidia-smi's machine format: pure input → expected tables."""

from __future__ import annotations

import pytest

from potato.errors import BackendError, ParseError
from potato.backends.ssh.gpus import NoFreeGpu, NoKernels, choose_gpus, has_kernels, mark_kernels, parse_nvidia_smi

# As `nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,utilization.gpu,pci.bus_id,compute_cap
# --format=csv,noheader,nounits` prints it; the second card's utilisation is not supported.
SMI = (
    "0, NVIDIA A100-SXM4-80GB, 81920, 80000, 1920, 2, 00000000:07:00.0, 8.0\n"
    "1, NVIDIA A100-SXM4-80GB, 81920, 60000, 21920, [N/A], 00000000:0F:00.0, 8.0\n"
    "2, Tesla K80, 11441, 100, 11341, 0, 00000000:84:00.0, 3.7\n"
)


def test_parse_reads_every_field_and_not_supported_values():
    gpus = parse_nvidia_smi(SMI)
    assert [(g.index, g.memory_free_mb, g.utilization_pct, g.compute_cap) for g in gpus] == [
        (0, 1920, 2, (8, 0)), (1, 21920, None, (8, 0)), (2, 11341, 0, (3, 7))]
    assert gpus[1].describe() == "GPU 1: NVIDIA A100-SXM4-80GB, 21920 of 81920 MB free, utilisation unknown"


def test_parse_quotes_what_it_cannot_read():
    with pytest.raises(ParseError, match="Could not make sense of nvidia-smi output 'No devices were found'"):
        parse_nvidia_smi("No devices were found")


@pytest.mark.parametrize("setting, min_free, expected", [
    ("auto", 2000, (1,)),          # most free memory, not lowest utilisation
    ("1", 2000, (1,)),
    ("0,2", 2000, (0, 2)),         # pins are the user's word, free memory or not
    ("none", 2000, ()),
])
def test_choose(setting, min_free, expected):
    assert choose_gpus(parse_nvidia_smi(SMI), setting, min_free).indices == expected


def test_auto_widened_by_max_gpus_takes_the_most_free_that_each_have_enough():
    gpus = parse_nvidia_smi(SMI)
    choice = choose_gpus(gpus, "auto", 1000, max_gpus=2)
    assert choice.indices == (1, 2) and choice.reason == "most free memory: 21920, 11341 MB"
    assert choose_gpus(gpus, "auto", 5000, max_gpus=3).indices == (1, 2)  # GPU 0 has too little free
    assert choose_gpus(gpus, "auto", 15000, max_gpus=2).indices == (1,)  # fewer than asked: as many as fit
    assert choice.describe(gpus) == (
        "GPU 1 (NVIDIA A100-SXM4-80GB), GPU 2 (Tesla K80) (most free memory: 21920, 11341 MB)")


def test_auto_refuses_when_no_gpu_has_enough_free():
    with pytest.raises(NoFreeGpu, match=r"^No GPU has 40000 MB free\. Fix: "):
        choose_gpus(parse_nvidia_smi(SMI), "auto", 40000)


def test_a_host_without_gpus_trains_on_the_cpu_and_a_pin_to_nothing_is_refused():
    assert choose_gpus([], "auto", 2000).indices == ()
    with pytest.raises(BackendError, match="gpus: '1' names GPU 1, but the host has no GPU"):
        choose_gpus([], "1", 2000)


def test_auto_skips_gpus_without_kernels():
    torch = {"ok": True, "cuda": "12.4", "arch_list": ["sm_80", "sm_90"]}
    gpus = mark_kernels(parse_nvidia_smi(SMI), torch)
    assert [g.has_kernels for g in gpus] == [True, True, False]
    assert gpus[2].describe().endswith("(torch there has no kernels for it)")
    assert choose_gpus(gpus, "auto", 11000).indices == (1,)
    cpu_torch = mark_kernels(parse_nvidia_smi(SMI), {"ok": True, "cuda": None, "arch_list": []})
    with pytest.raises(NoKernels, match="^This host's torch has no kernels for any of its GPUs"):
        choose_gpus(cpu_torch, "auto", 0)


@pytest.mark.parametrize("capability, arch_list, expected", [
    ((8, 0), ["sm_80"], True),
    ((8, 6), ["sm_80"], True),                 # binary compatible within a major version (torch's own rule)
    ((9, 0), ["sm_80"], False),
    ((8, 6), ["sm_80", "compute_80"], True),   # PTX JIT-compiles upward
    ((7, 0), ["compute_80"], False),
    ((3, 7), [], True),                        # nothing to judge by
    (None, ["sm_80"], True),                   # nvidia-smi did not say: the worker finds out
])
def test_has_kernels(capability, arch_list, expected):
    assert has_kernels(capability, arch_list) is expected


def test_auto_asks_for_the_trainers_estimate_when_it_is_more_than_min_free_gpu_mb():
    gpus = parse_nvidia_smi(SMI)
    by = "hf-llm-finetune's estimate for /models/llama-8b"
    fits = choose_gpus(gpus, "auto", 2000, max_gpus=2, needed_mb=15000, needed_by=by)
    assert (fits.indices, fits.min_free_mb, fits.needed_mb) == ((1,), 2000, 15000)  # GPU 2 has 11341 free
    below = choose_gpus(gpus, "auto", 2000, max_gpus=3, needed_mb=1500, needed_by=by)  # min_free_gpu_mb rules
    assert (below.indices, below.needed_mb) == ((1, 2), None)
    with pytest.raises(NoFreeGpu) as refused:
        choose_gpus(gpus, "auto", 2000, needed_mb=30000, needed_by=by)
    assert str(refused.value) == (
        "No GPU has 30000 MB free (hf-llm-finetune's estimate for /models/llama-8b). Fix: wait, set trainer "
        "options that need less memory, or pin a GPU with gpus: \"1\" (`potato training check <backend> "
        "config.yaml` lists the GPUs and the estimate)")
    assert choose_gpus(gpus, "0", 2000, needed_mb=30000, needed_by=by).indices == (0,)  # a pin is the user's word
