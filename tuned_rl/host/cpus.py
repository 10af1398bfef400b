"""CPU sets as the kernel writes them: lists ("0-2,5") and hex masks ("3", "ff,00000000")."""

from __future__ import annotations


# The most CPUs a Linux kernel can be built for (x86-64's CONFIG_NR_CPUS with MAXSMP, arch/x86/Kconfig):
# a list or mask naming a CPU beyond it is refused before any set of that size is built.
MAX_CPUS = 8192


class BeyondMaxCpus(ValueError):
    """A CPU list naming a CPU number no Linux kernel has (``cpu``)."""

    def __init__(self, text: str, cpu: int):
        super().__init__(f"not a CPU list: {text[:80]!r} names CPU {cpu}, and Linux has at most {MAX_CPUS}")
        self.cpu = cpu


def parse_cpu_list(text: str) -> set[int]:
    """"0-2,5" -> {0, 1, 2, 5}; raises ValueError on anything else (an empty list too, and a CPU
    number of MAX_CPUS or more: "0-4000000000" would build a set of four billion)."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()) or (sep and int(high) < int(low)):
            raise ValueError(f"not a CPU list: {text!r}")
        last = int(high if sep else low)
        if last >= MAX_CPUS:
            raise BeyondMaxCpus(text, last)
        cpus.update(range(int(low), last + 1))
    return cpus


def format_cpu_list(cpus) -> str:
    """{0, 1, 2, 5} -> "0-2,5"."""
    ordered, ranges = sorted(cpus), []
    for cpu in ordered:
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges)


def parse_cpu_mask(text: str) -> set[int]:
    """A hex mask in the kernel's 32-bit groups ("ff,00000001"; "" or "0" is empty) -> CPU numbers."""
    digits = text.strip().replace(",", "")
    if digits.lower().startswith("0x"):
        digits = digits[2:]
    if len(digits) > MAX_CPUS // 4:
        raise ValueError(f"not a CPU mask: {text[:80]!r} is longer than {MAX_CPUS} CPUs")
    try:
        value = int(digits or "0", 16)
    except ValueError:
        raise ValueError(f"not a CPU mask: {text[:80]!r}") from None
    return {bit for bit in range(value.bit_length()) if value >> bit & 1}


def format_cpu_mask(cpus) -> str:
    """{0, 1} -> "3"; {32} -> "1,00000000": the groups the kernel prints, without leading zero groups."""
    value = sum(1 << cpu for cpu in set(cpus))
    groups = []
    while True:
        groups.insert(0, value & 0xFFFFFFFF)
        value >>= 32
        if not value:
            break
    return ",".join([f"{groups[0]:x}"] + [f"{g:08x}" for g in groups[1:]])
