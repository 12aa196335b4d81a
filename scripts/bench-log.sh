#!/usr/bin/env bash
# Builds the release and runs log_store_bench: the log store against the raw fdatasync
# baseline, RocksDB and SQLite on one disk in one run. Writes the JSON to
# build/bench-results/log_store_bench.json, then prints the ratios the targets name.
#
# IDEM_BENCH_DIR (default /tmp/idem-bench) must be on the disk to measure; the counts are listed
# at the top of bench/log_store_bench.cc, and IDEM_BENCH_SCALE=0.02 makes a quick run.
# fsync latency is noisy (shared disks, VMs), so each benchmark runs 3 times, in random order; the
# summary uses the medians. Arguments go to the binary after these defaults and override them:
# --benchmark_repetitions=1, --benchmark_filter=rocksdb, ...
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target log_store_bench
out=build/bench-results
mkdir -p "$out"
./build/release/bench/log_store_bench --benchmark_repetitions=3 \
  --benchmark_enable_random_interleaving=true --benchmark_display_aggregates_only=true \
  --benchmark_out="$out/log_store_bench.json" --benchmark_out_format=json "$@"

python3 - "$out/log_store_bench.json" <<'EOF'
import json
import sys

runs = json.load(open(sys.argv[1]))["benchmarks"]
has_median = any(r.get("aggregate_name") == "median" for r in runs)
results = {}  # (family, threads) -> run
for r in runs:
    if has_median and r.get("aggregate_name") != "median":
        continue
    family = r["run_name"].split("/iterations:")[0].split("/manual_time")[0].split("/real_time")[0]
    results[(family, r.get("threads", 1))] = r


def get(family, threads, field="items_per_second"):
    r = results.get((family, threads))
    if r is None or r.get("error_occurred"):
        return None
    return r.get(field)


def seconds(family):
    r = results.get((family, 1))
    if r is None or r.get("error_occurred"):
        return None
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[r["time_unit"]]
    return r["real_time"] * scale


def num(x, unit=""):
    if x is None:
        return "-"
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{suffix}{unit}"
    return f"{x:.1f}{unit}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


for r in runs:
    if r.get("error_occurred"):
        print(f"ERROR {r['name']}: {r.get('error_message')}")

print()
print("cycles/s (records/s for raw) by callers")
print(f"{'':28}{'1':>12}{'16':>12}{'64':>12}")
rows = [
    ("idem log, sync=always", "log_store/sync:always", "items_per_second"),
    ("  log records per write()", "log_store/sync:always", "records_per_write"),
    ("idem log, batch API 100", "log_store/sync:always/batch:100", "items_per_second"),
    ("  log records per write()", "log_store/sync:always/batch:100", "records_per_write"),
    ("raw append, batch=callers", None, None),
    ("RocksDB, batch 100", "rocksdb/batch:100", "items_per_second"),
    ("RocksDB, batch 1 (context)", "rocksdb/batch:1", "items_per_second"),
    ("SQLite, batch 100", "sqlite/batch:100", "items_per_second"),
]
for label, family, field in rows:
    if family is None:
        cells = [get(f"raw_append/batch:{c}", 1) for c in (1, 16, 64)]
    else:
        cells = [get(family, c, field) for c in (1, 16, 64)]
    print(f"{label:28}" + "".join(f"{num(x):>12}" for x in cells))

idem64 = get("log_store/sync:always", 64)
raw64 = get("raw_append/batch:64", 1)
nosync2 = get("log_store/sync:none", 2)
warm = seconds("log_store/recovery/cache:warm")
cold = seconds("log_store/recovery/cache:cold")
records = get("log_store/recovery/cache:warm", 1, "records")


def target(name, value, goal, ok, text):
    verdict = "-" if value is None else ("PASS" if ok(value) else "FAIL")
    print(f"{name:46}{text(value):>12}   {goal:>10}  {verdict}")


print()
print(f"{'target (sync=always at 64 callers unless said)':46}{'measured':>12}   {'goal':>10}")
target("idem cycles/s", idem64, ">= 100k", lambda v: v >= 100e3, num)
target("idem / RocksDB batch 100", ratio(idem64, get("rocksdb/batch:100", 64)), ">= 2x",
       lambda v: v >= 2, lambda v: "-" if v is None else f"{v:.2f}x")
target("idem / SQLite batch 100", ratio(idem64, get("sqlite/batch:100", 64)), ">= 4x",
       lambda v: v >= 4, lambda v: "-" if v is None else f"{v:.2f}x")
target("idem records/s (2 a cycle) / raw batch 64", ratio(None if idem64 is None else 2 * idem64, raw64),
       ">= 50%", lambda v: v >= 0.5, lambda v: "-" if v is None else f"{100 * v:.0f}%")
target("  stricter: idem cycles/s / raw batch 64", ratio(idem64, raw64), "(>= 50%)",
       lambda v: v >= 0.5, lambda v: "-" if v is None else f"{100 * v:.0f}%")
overlap32 = get("raw_append/syncs_in_flight:2/batch:32", 2)
overlap64 = get("raw_append/syncs_in_flight:2/batch:64", 2)
print("context: the raw baseline with two fdatasyncs in flight (two threads writing in turn):")
print(f"{'  raw, 2 syncs in flight, batch 32 / 64':46}{num(overlap32):>12}{num(overlap64):>12}   "
      f"(batch 64: {'-' if overlap64 is None or not raw64 else f'{overlap64 / raw64:.2f}x'} one sync)")
batch64 = get("log_store/sync:always/batch:100", 64)
print("the same with idem's batch API, 100 keys a call (as the peers batch them):")
target("  idem batch 100 cycles/s", batch64, "(>= 100k)", lambda v: v >= 100e3, num)
target("  idem batch 100 / RocksDB batch 100", ratio(batch64, get("rocksdb/batch:100", 64)),
       "(>= 2x)", lambda v: v >= 2, lambda v: "-" if v is None else f"{v:.2f}x")
target("  idem batch 100 / SQLite batch 100", ratio(batch64, get("sqlite/batch:100", 64)),
       "(>= 4x)", lambda v: v >= 4, lambda v: "-" if v is None else f"{v:.2f}x")
target("idem sync=none cycles/s, 2 threads", nosync2, ">= 1M", lambda v: v >= 1e6, num)
target(f"recovery open, {num(records)} records, warm cache", warm, "<= 5 s", lambda v: v <= 5,
       lambda v: "-" if v is None else f"{v:.2f} s")
target(f"recovery open, {num(records)} records, cold cache", cold, "<= 5 s", lambda v: v <= 5,
       lambda v: "-" if v is None else f"{v:.2f} s")

print()
print("bytes per record on disk (directory size / keys)")
for label, value in [
    ("idem log, 100-byte response (sync=always, 64)", get("log_store/sync:always", 64, "bytes_per_record")),
    ("idem log, 100-byte response (sync=none, 2)", get("log_store/sync:none", 2, "bytes_per_record")),
    ("idem log, no response (recovery store)", get("log_store/recovery/cache:warm", 1, "bytes_per_record")),
    ("RocksDB, after CompactRange (batch 100, 64)", get("rocksdb/batch:100", 64, "bytes_per_record")),
    ("SQLite, after checkpoint (batch 100, 64)", get("sqlite/batch:100", 64, "bytes_per_record")),
]:
    print(f"{label:52}{'-' if value is None else f'{value:.0f}':>8}")
EOF
