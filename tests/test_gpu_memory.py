"""A GPU's budget from TensorFlow's memory_limit, NVML as a cross-check, the allocator
mode and one GPU per local worker: on the CPU, with the device listing substituted."""

import json
import types

import pytest

from kadapt.batching.tensorflow import allocator_mode
from kadapt.batching import gpu_memory
from kadapt.batching import memory_budget
from kadapt.batching.tensorflow.allocator_region import reserve_region
from kadapt.batching.memory_budget import MemoryBudget
from kadapt.cli.probe import gpu_line
from kadapt.run.errors import UsageError
from kadapt.run.probe_text import check_probe_allocator
from kadapt.run.workers import JaxWorkers
from kadapt.run.workers import TensorFlowWorkers
from kadapt.run.workers import worker_environment
from kadapt.run.workers import worker_gpus

GiB, MiB = 2**30, 2**20


def fake_nvml(boards):
    """A `pynvml` stand-in: `boards` is a list of (uuid, total bytes) in NVML's order."""
    return types.SimpleNamespace(
        NVMLError=RuntimeError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(boards), nvmlDeviceGetHandleByIndex=lambda i: boards[i],
        nvmlDeviceGetUUID=lambda board: board[0].encode(),
        nvmlDeviceGetMemoryInfo=lambda board: types.SimpleNamespace(total=board[1]),
    )


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setattr(gpu_memory, "_import_nvml", lambda: None)
    monkeypatch.delenv("KADAPT_MEMORY_BUDGET", raising=False)


def test_the_budget_is_tensorflows_memory_limit_less_the_margin(monkeypatch, no_nvml):
    monkeypatch.setattr(gpu_memory, "tensorflow_memory_limits", lambda: {"CPU:0": GiB, "GPU:1": 8 * GiB})
    budget = memory_budget.device_budget(None, "GPU:1")
    assert budget.bytes == 8 * GiB - 512 * MiB - int(0.05 * 8 * GiB)
    assert budget.source == "TensorFlow memory_limit 8.0 GiB less 512 MiB + 5%"


def test_a_logical_device_limit_when_tensorflow_lists_no_limit(monkeypatch, no_nvml):
    monkeypatch.setattr(gpu_memory, "_logical_limit", lambda index: 4 * GiB if index == 0 else None)
    capacity = gpu_memory.gpu_capacity("GPU:0", list_limits=dict)
    assert capacity == gpu_memory.GpuCapacity(4 * GiB, "logical device memory_limit", None)
    with pytest.raises(ValueError, match=r"memory of GPU:1 is unknown.*`memory_budget=`.*Received: memory_budget=None, device='GPU:1'"):
        gpu_memory.gpu_capacity("GPU:1", list_limits=dict)


def test_tensorflows_listing_reads_the_eager_devices():
    assert gpu_memory.tensorflow_memory_limits()["CPU:0"] > 0  # the internals it reads exist in this TF


@pytest.mark.parametrize("visible, index, total", [
    (None, 1, 2 * GiB), ("2,0", 0, 3 * GiB), ("2,0", 1, 1 * GiB),
    ("GPU-bbbb-2222", 0, 2 * GiB), ("GPU-cccc", 0, 3 * GiB), ("GPU-dddd", 0, None),
])
def test_nvml_maps_tensorflows_gpus_through_cuda_visible_devices(visible, index, total):
    nvml = fake_nvml([("GPU-aaaa-1111", 1 * GiB), ("GPU-bbbb-2222", 2 * GiB), ("GPU-cccc-3333", 3 * GiB)])
    assert gpu_memory.nvml_total(index, visible if visible else "", nvml) == total


def test_without_nvml_the_pool_stands_alone(monkeypatch, no_nvml):
    capacity = gpu_memory.gpu_capacity("GPU:0", lambda: {"GPU:0": 80 * GiB})
    assert (capacity.pool_bytes, capacity.nvml_total_bytes) == (80 * GiB, None)
    broken = fake_nvml([])
    broken.nvmlInit = lambda: (_ for _ in ()).throw(RuntimeError("no driver"))
    assert gpu_memory.nvml_total(0, "", broken) is None


def test_the_fact_sheet_names_the_source_of_each_figure():
    device = {"device": "GPU:0", "total_bytes": 80 * GiB, "source": "TensorFlow memory_limit",
              "nvml_total_bytes": 80 * GiB, "budget_bytes": 75.5 * GiB, "allocator": "cuda_malloc_async",
              "peaks_count": allocator_mode.COUNTS["cuda_malloc_async"]}
    assert gpu_line(device) == ("GPU:0 capacity 80.0 GiB (TensorFlow memory_limit), NVML total 80.0 GiB, "
                                "budget 75.5 GiB; allocator cuda_malloc_async: peaks count requested bytes "
                                "(CUDA's async allocator)")


@pytest.mark.parametrize("variables, growth, mode", [
    ({}, False, "bfc"), ({}, True, "bfc-growth"), ({"TF_FORCE_GPU_ALLOW_GROWTH": "true"}, False, "bfc-growth"),
    ({"TF_FORCE_GPU_ALLOW_GROWTH": "false"}, True, "bfc"), ({"TF_FORCE_GPU_ALLOW_GROWTH": "True"}, False, "bfc"),
    ({"TF_GPU_ALLOCATOR": "cuda_malloc_async"}, True, "cuda_malloc_async"),
])
def test_allocator_mode_of_a_gpu(monkeypatch, variables, growth, mode):
    for name in ("TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert allocator_mode.allocator_mode("GPU:0", memory_growth=lambda device: growth) == mode


def test_allocator_mode_of_the_cpu(monkeypatch):
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
    assert allocator_mode.allocator_mode("CPU:0") == "cpu-bfc"
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC")
    assert allocator_mode.allocator_mode("CPU:0") == "cpu"


def test_memory_growth_refuses_a_probed_size(monkeypatch):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    with pytest.raises(ValueError, match=r"`micro_batch_size` cannot be 'auto'.*memory growth on for GPU:0.*"
                                         r"unset TF_FORCE_GPU_ALLOW_GROWTH.*int micro_batch_size\. "
                                         r"Received: micro_batch_size='auto', allocator mode 'bfc-growth'"):
        reserve_region(MemoryBudget(GiB, "GPU:0", "memory_budget argument"))
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")
    reserve_region(MemoryBudget(GiB, "GPU:0", "memory_budget argument"))  # one region: nothing to do


@pytest.mark.parametrize("count, gpus, visible, expected", [
    (2, 2, None, ["0", "1"]), (2, 3, "3,GPU-abcd,1", ["3", "GPU-abcd"]), (1, 1, "2", ["2"]), (3, 0, None, None),
])
def test_each_local_worker_gets_one_visible_gpu(count, gpus, visible, expected):
    assert worker_gpus(count, gpus, visible) == expected


def test_more_workers_than_gpus_is_one_usage_error():
    with pytest.raises(UsageError, match=r"^--workers starts one worker per GPU, and TensorFlow sees 2 GPU\(s\) "
                                         r"here \(CUDA_VISIBLE_DEVICES=0,3\): pass --workers 2 or fewer.*"
                                         r"Received: --workers=3$"):
        worker_gpus(3, 2, "0,3")
    with pytest.raises(UsageError, match=r"^--workers starts one worker per GPU, and JAX sees 2 GPU\(s\) here: .*"
                                         r"on another host with KERAS_DISTRIBUTION_\* variables"):
        worker_gpus(3, 2, None, JaxWorkers)


def test_a_workers_environment_on_gpu_and_cpu_hosts():
    cluster = TensorFlowWorkers(2)
    on_gpu = worker_environment(1, cluster, 4, ["5", "7"])
    assert on_gpu["CUDA_VISIBLE_DEVICES"] == "7" and on_gpu["KADAPT_WORKER_THREADS"] == "4"
    assert json.loads(on_gpu["TF_CONFIG"]) == {"cluster": {"worker": [f"127.0.0.1:{port}" for port in cluster.ports]},
                                               "task": {"type": "worker", "index": 1}}
    assert set(worker_environment(1, cluster, 4, None)) == {"KADAPT_WORKER_THREADS", "TF_CONFIG"}


def test_a_jax_process_environment_names_process_0s_coordinator_the_count_and_its_index():
    cluster = JaxWorkers(2)
    assert worker_environment(1, cluster, 4, ["5", "7"]) == {
        "KADAPT_WORKER_THREADS": "4", "CUDA_VISIBLE_DEVICES": "7",
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"127.0.0.1:{cluster.port}", "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1"}


def test_the_command_line_refuses_memory_growth_in_its_own_words(monkeypatch):
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    with pytest.raises(UsageError, match=r"^kadapt measures the micro-batch with trial steps, which it cannot do "
                                         r"with GPU memory growth on for GPU:0.*Received: allocator mode 'bfc-growth'$"):
        check_probe_allocator("GPU:0")
    check_probe_allocator("CPU:0")
