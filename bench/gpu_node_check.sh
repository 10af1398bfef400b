#!/bin/bash
# tuned-rl on a real GPU node: what this VM cannot show. Run as root from a checkout after
# `bash tools/setup.sh`:
#
#     sudo bash bench/gpu_node_check.sh
#
# One line per check, with its figures:
#   doctor            which probe measures here;
#   diagnose GPU      for each GPU (nvidia-smi's list, or /proc/driver/nvidia/gpus): a canary
#                     diagnosed 5 s with --gpu: the NUMA and PCIe-sharing findings, the NVMe/NIC
#                     devices under its switch, the nvidia_ioctl timer's state;
#   exec --gpu        a small program run bound to the first GPU's node: its CPUs, and how many
#                     of its mappings read bind:NODE in its numa_maps;
#   dry run           profiles/llm-gpu-node.toml with gpu = the first GPU: its steps and skips;
#   ioctl timer       `measure --ioctl nvidia_ioctl` on a running `nvidia-smi dmon` (CUDA-free
#                     queries): its calls, mean and p99.
# Nothing is changed (diagnose, exec, a dry run and measure change nothing; exec's program exits);
# every check has a time limit, and the whole ends in under 5 minutes. Exit 0 when every check
# ran (or there is no GPU to check), 1 when one failed.
set -u
cd "$(dirname "$0")/.."
TUNED_RL=(.venv/bin/python -m tuned_rl.cli)
[ -x .venv/bin/python ] || TUNED_RL=(python3 -m tuned_rl.cli)
WORK=$(mktemp -d /tmp/tuned-rl-gpu-check.XXXXXX)
trap 'kill "${DMON:-}" 2>/dev/null; rm -rf "$WORK"' EXIT
failed=0

say() { printf '%-16s %s\n' "$1" "$2"; }
field() {  # field FILE PYTHON-EXPRESSION-ON-r: one figure from a JSON file
    python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo "?"
}

gpus=()
if command -v nvidia-smi >/dev/null 2>&1; then
    while read -r bus; do
        [ -n "$bus" ] && gpus+=("$(echo "$bus" | tr 'A-F' 'a-f' | sed -E 's/^0000([0-9a-f]{4}:)/\1/')")
    done < <(timeout 30 nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null)
fi
if [ ${#gpus[@]} -eq 0 ] && [ -d /proc/driver/nvidia/gpus ]; then
    for entry in /proc/driver/nvidia/gpus/*; do [ -e "$entry" ] && gpus+=("$(basename "$entry")"); done
fi
if [ ${#gpus[@]} -eq 0 ]; then
    say "gpu check" "skipped: no GPU on this host (no nvidia-smi GPU, no /proc/driver/nvidia/gpus): nothing to check"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "gpu check" "needs root (the probes load BPF programs)"
    exit 1
fi

if timeout 60 "${TUNED_RL[@]}" doctor --json > "$WORK/doctor.json"; then
    say "doctor" "probe auto = $(field "$WORK/doctor.json" 'r["auto"]')"
else
    say "doctor" "FAILED: no probe can measure here ($(field "$WORK/doctor.json" 'r["auto"]'))"; failed=1
fi

node_of() { cat "/sys/bus/pci/devices/$1/numa_node" 2>/dev/null || echo "?"; }
for gpu in "${gpus[@]}"; do
    out="$WORK/diagnose-$gpu.json"
    if [ "$(node_of "$gpu")" = "-1" ]; then
        say "diagnose $gpu" "skipped: the firmware gives it no NUMA node (numa_node reads -1): --gpu cannot be used"
        continue
    fi
    if timeout 90 "${TUNED_RL[@]}" diagnose --target canary --seconds 5 --gpu "$gpu" --json > "$out" 2> "$WORK/err"; then
        say "diagnose $gpu" "$(field "$out" '"findings: " + (", ".join(f["cause"] for f in r["findings"]) or "none") + "; sharing its PCIe uplink: " + (", ".join(s["kind"] + " " + s["address"] for s in r["pcie"]["shared"]) or "nothing") + "; ioctl timer: " + r["ioctl"].get("absent", "ready")')"
    else
        say "diagnose $gpu" "FAILED: $(tail -1 "$WORK/err")"; failed=1
    fi
done

first=${gpus[0]}
if [ "$(node_of "$first")" = "-1" ]; then
    say "exec --gpu" "skipped: $first has no NUMA node in sysfs (numa_node -1)"
    say "dry run" "skipped: $first has no NUMA node in sysfs (numa_node -1)"
    first=""
fi
program='import re; s = open("/proc/self/status").read(); m = open("/proc/self/numa_maps").read().splitlines(); print(re.search(r"Cpus_allowed_list:\s*(\S+)", s).group(1), sum(" bind:" in l for l in m), len(m))'
if [ -z "$first" ]; then
    :
elif read -r cpus bound maps < <(timeout 30 "${TUNED_RL[@]}" exec --gpu "$first" -- python3 -c "$program" 2> "$WORK/err"); then
    say "exec --gpu" "$first: CPUs $cpus; $bound of $maps mappings read bind in numa_maps"
else
    say "exec --gpu" "FAILED: $(tail -1 "$WORK/err")"; failed=1
fi

sed -E "s/^node = 0$/gpu = \"$first\"/" profiles/llm-gpu-node.toml > "$WORK/llm-gpu-node.toml"
if [ -z "$first" ]; then
    :
elif timeout 60 "${TUNED_RL[@]}" apply "$WORK/llm-gpu-node.toml" --dry-run --json > "$WORK/plan.json" 2> "$WORK/err"; then
    say "dry run" "$(field "$WORK/plan.json" 'str(len(r["steps"])) + " steps: " + "; ".join(s["step"] + (" (skipped: " + s["reason"] + ")" if s.get("outcome") == "skipped" else " (" + str(len(s["changes"])) + " changes)") for s in r["steps"])')"
else
    say "dry run" "FAILED: $(tail -1 "$WORK/err")"; failed=1
fi

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi dmon -d 1 -c 20 > /dev/null 2>&1 &
    DMON=$!
    sleep 1
    if timeout 60 "${TUNED_RL[@]}" measure --target "pid:$DMON" --seconds 5 --ioctl nvidia_ioctl --json \
            > "$WORK/ioctl.json" 2> "$WORK/err"; then
        say "ioctl timer" "$(field "$WORK/ioctl.json" '"nvidia_ioctl (" + r["ioctl"]["how"] + "): " + str(r["ioctl"]["calls"]) + " calls by nvidia-smi dmon in 5 s, mean " + str(r["ioctl"].get("mean_us", "-")) + " us, p99 " + str(r["ioctl"].get("p99_us", "-")) + " us"')"
    else
        say "ioctl timer" "FAILED: $(tail -1 "$WORK/err")"; failed=1
    fi
else
    say "ioctl timer" "skipped: no nvidia-smi to make the calls"
fi
exit $failed
