"""What each supported GPU type implies. The only place in the project that knows these facts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The keys of GPU_PRESETS and CPU_MACHINES, as types the settings check values against.
GpuType = Literal["nvidia-b200", "nvidia-h200-141gb"]
CpuMachineType = Literal[
    "c3-highmem-88", "c3-standard-88", "n2-highmem-128", "n2-highmem-32", "n2-highmem-48", "n2-highmem-64",
    "n2-highmem-80", "n2-highmem-96", "n2-standard-32", "n2-standard-64", "n2-standard-80",
]  # fmt: skip


@dataclass(frozen=True)
class GpuPreset:
    """One GKE accelerator label and the machine shape that carries it."""

    gpu_type: GpuType  # GKE accelerator label, also the node label value
    machine_type: str
    gpus_per_node: int
    vcpus: int
    memory_gb: int  # as GCE publishes it, in GB (10^9 bytes)
    tuner_config: str  # file name under /usr/local/gib/configs on the node
    min_gke_version: str  # GPUDirect RDMA on this machine (GKE docs: gpu-bandwidth-gpudirect-rdma)
    # A3 Ultra and A4 machines boot only from Hyperdisk.
    boot_disk_type: str = "hyperdisk-balanced"
    # NICs: 2 gVNIC (one is the node's primary) and one RDMA NIC per GPU.
    rdma_nics: int = 8


# Boot disks of both pools (infra/cluster.py, infra/gpu_pool.py; the NeMo RL image is tens of GB). The cost estimate
# counts them; tests/test_cost.py holds these to what the pools register.
BOOT_DISK_GIB = 500
CPU_BOOT_DISK_TYPE = "pd-balanced"

GPU_PRESETS: dict[GpuType, GpuPreset] = {
    preset.gpu_type: preset
    for preset in (
        GpuPreset(
            gpu_type="nvidia-h200-141gb",
            machine_type="a3-ultragpu-8g",
            gpus_per_node=8,
            vcpus=224,
            memory_gb=2952,
            tuner_config="tuner_config_a3u.txtpb",
            min_gke_version="1.31.4-gke.1183000",
        ),
        GpuPreset(
            gpu_type="nvidia-b200",
            machine_type="a4-highgpu-8g",
            gpus_per_node=8,
            vcpus=224,
            memory_gb=3968,
            tuner_config="tuner_config_a4.txtpb",
            # GKE docs, "Maximize GPU network bandwidth with GPUDirect RDMA": A4 needs 1.32.2-gke.1475000 or later.
            min_gke_version="1.32.2-gke.1475000",
        ),
    )
}


@dataclass(frozen=True)
class CpuMachine:
    vcpus: int
    memory_gb: int


# CPU machine types we size the Ray head against. Figures are GCE's published shapes.
CPU_MACHINES: dict[CpuMachineType, CpuMachine] = {
    "n2-highmem-32": CpuMachine(vcpus=32, memory_gb=256),
    "n2-highmem-48": CpuMachine(vcpus=48, memory_gb=384),
    "n2-highmem-64": CpuMachine(vcpus=64, memory_gb=512),
    "n2-highmem-80": CpuMachine(vcpus=80, memory_gb=640),
    "n2-highmem-96": CpuMachine(vcpus=96, memory_gb=768),
    "n2-highmem-128": CpuMachine(vcpus=128, memory_gb=864),
    "n2-standard-32": CpuMachine(vcpus=32, memory_gb=128),
    "n2-standard-64": CpuMachine(vcpus=64, memory_gb=256),
    "n2-standard-80": CpuMachine(vcpus=80, memory_gb=320),
    "c3-highmem-88": CpuMachine(vcpus=88, memory_gb=704),
    "c3-standard-88": CpuMachine(vcpus=88, memory_gb=352),
}
