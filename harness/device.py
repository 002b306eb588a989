"""Detect the device (pynvml on NVIDIA, the processor otherwise) and sample telemetry.

torch and pynvml are imported inside functions: importing this module costs nothing.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field

from planner.core.errors import LlmplanError


class DeviceError(LlmplanError):
    """The requested device is absent (exit code 3)."""

    exit_code = 3


@dataclass
class DeviceInfo:
    kind: str  # "cuda" | "cpu"
    name: str
    memory_bytes: int
    torch_version: str
    hardware_db: str | None = None  # matched hardware_db entry
    driver: str | None = None
    cuda: str | None = None
    capability: str | None = None
    power_limit_w: float | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    cpu_cores: int | None = None
    torch_threads: int | None = None
    free_memory_bytes: int | None = None  # CUDA: free when the run started (others' use out)
    uuid: str | None = None  # CUDA: the device's UUID (NVML is opened by it, not by index)
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


# (pattern on the NVML / CUDA device name, hardware_db entry): first match wins
_GPU_NAMES = [
    (r"H200", "h200"),
    (r"H100.*NVL", "h100-nvl"),
    (r"H100.*PCIe", "h100-pcie"),
    (r"H100", "h100-sxm"),
    (r"B200", "b200"),
    (r"A100.*PCIE.*80|A100.*80.*PCIE", "a100-pcie-80gb"),
    (r"A100.*PCIE", "a100-pcie-40gb"),
    (r"A100.*80", "a100-sxm-80gb"),
    (r"A100", "a100-sxm-40gb"),
    (r"L40S", "l40s"),
    (r"\bL4\b", "l4"),
    (r"A10G", "a10g"),
    (r"T4\b", "t4"),
    (r"V100", "v100-sxm2-32gb"),
    (r"4090", "rtx-4090"),
    (r"MI300X", "mi300x"),
]


def match_hardware(name: str) -> str | None:
    for pattern, entry in _GPU_NAMES:
        if re.search(pattern, name, re.IGNORECASE):
            return entry
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def nvml_handle(pynvml, info: DeviceInfo):
    """NVML's handle of the device torch calls cuda:0. NVML numbers devices by PCI order,
    ignoring CUDA_VISIBLE_DEVICES, so an index can name another GPU: the UUID cannot."""
    pynvml.nvmlInit()
    if info.uuid:
        return pynvml.nvmlDeviceGetHandleByUUID(info.uuid)
    info.extra["nvml_device"] = "index 0: this torch gives no device UUID"
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def detect(device: str = "auto", *, threads: int | None = None) -> DeviceInfo:
    """The device to measure: ``cuda``, ``cpu`` or ``auto`` (CUDA if present)."""
    import torch

    if device not in ("auto", "cuda", "cpu"):
        raise LlmplanError(f"--device: '{device}' is not one of auto, cuda, cpu")
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise DeviceError("--device cuda: no CUDA device is visible to torch "
                          f"{torch.__version__} (CUDA build: {torch.version.cuda})")
    if device == "cuda" or (device == "auto" and has_cuda):
        props = torch.cuda.get_device_properties(0)
        free, _ = torch.cuda.mem_get_info(0)
        uuid = getattr(props, "uuid", None)
        info = DeviceInfo(kind="cuda", name=props.name, memory_bytes=props.total_memory,
                          torch_version=str(torch.__version__), cuda=torch.version.cuda,
                          capability=f"{props.major}.{props.minor}",
                          hardware_db=match_hardware(props.name), free_memory_bytes=free,
                          uuid=f"GPU-{uuid}" if uuid is not None else None)
        try:
            import pynvml

            h = nvml_handle(pynvml, info)
            info.driver = pynvml.nvmlSystemGetDriverVersion()
            info.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
            info.max_sm_clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
            info.max_mem_clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
        except Exception as err:  # NVML is optional: the record says why it is missing
            info.extra["nvml_error"] = f"{type(err).__name__}: {err}"
        return info
    if threads:
        torch.set_num_threads(threads)
    return DeviceInfo(kind="cpu", name=_cpu_name(), memory_bytes=_mem_total_bytes(),
                      torch_version=str(torch.__version__), cpu_cores=os.cpu_count(),
                      torch_threads=torch.get_num_threads())


class Telemetry:
    """Samples clocks, power, temperature and throttle reasons while a point runs (NVML), or
    the CPU's clock and load; ``summary()`` gives min / median / max of each."""

    def __init__(self, info: DeviceInfo, interval_s: float = 0.05):
        self.info, self.kind, self.interval_s = info, info.kind, interval_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None

    def __enter__(self) -> Telemetry:
        if self.kind == "cuda":
            try:
                import pynvml

                self._nvml = (pynvml, nvml_handle(pynvml, self.info))
            except Exception:
                self._nvml = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def _sample(self) -> dict:
        if self._nvml is not None:
            nv, h = self._nvml
            return {
                "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000,
                "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                "throttle_reasons": nv.nvmlDeviceGetCurrentClocksThrottleReasons(h),
            }
        out = {"load_1m": os.getloadavg()[0]}
        try:
            with open("/proc/cpuinfo") as f:
                mhz = [float(ln.split(":")[1]) for ln in f if ln.startswith("cpu MHz")]
            if mhz:
                out["cpu_clock_mhz"] = statistics.mean(mhz)
        except OSError:
            pass
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self._sample())
            except Exception as err:
                self.samples.append({"error": str(err)})
                return
            self._stop.wait(self.interval_s)

    def summary(self) -> dict:
        out: dict = {"samples": len(self.samples)}
        keys = {k for s in self.samples for k in s if k not in ("error", "throttle_reasons")}
        for k in sorted(keys):
            vals = [s[k] for s in self.samples if k in s]
            out[k] = {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}
        reasons = 0
        for s in self.samples:
            reasons |= s.get("throttle_reasons", 0)
        if self._nvml is not None:
            out["throttle_reasons_any"] = reasons
        return out


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
