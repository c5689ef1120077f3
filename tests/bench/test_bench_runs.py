"""Every bench runs at a smoke size, as a user runs it: ``bench/X.py`` in its own process from the repository root,
exiting 0 and printing the figures it promises (each pattern below is one of its figure lines or its table header).
A bench broken by a change elsewhere fails here, not on the next person who measures.

Each smoke size is set through the bench's own arguments. The temporary files of a bench (work directories, Spark's
log beside them) go under the test's ``tmp_path`` (``TMPDIR``). A bench that needs moto's server or Apache Pulsar's
jars skips without them, or fails under CI (``tests.fixtures.tools``). ``SMOKES`` start no Spark: seconds of CPU
each. ``SLOW_SMOKES`` start Spark, a job process that must converge, or Apache Pulsar, which no argument makes
small (a Spark start-up is 15-20 s on a calm machine): about 14 minutes together, so they run with
``--slow-benches`` and the default suite runs their ``--help``; where such a bench has a mode without Spark,
``SMOKES`` runs that mode too."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.offloading_broker import OFFLOADER_VERSION, build_command, offloader_jar
from bench.s3_endpoint import moto_command
from streamoffload.pulsar_standalone import PULSAR_VERSION, pulsar_lib_dir
from tests.fixtures.tools import missing_tool

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 1800
"""A bench that has not ended by then is stuck (a smoke run takes seconds to 7 minutes on 2 loaded cores)."""

NUMBER = r"[\d,]+(?:\.\d+)?"


@dataclass(frozen=True)
class Smoke:
    """One bench at its smoke size: the arguments (``{work}`` is the test's directory) and what it must print."""

    bench: str
    args: tuple[str, ...]
    prints: tuple[str, ...]
    """Regular expressions, each matching a whole line of its output (multiline mode)."""
    needs: tuple[str, ...] = ()
    """``moto`` (moto's server), ``pulsar`` (Apache Pulsar's jars), ``offloader`` (Pulsar's jcloud offloader)."""
    verdict: bool = False
    """The bench exits 1 when a measured figure misses its target (it printed the figures and its verdict): at a
    smoke size on a loaded machine that is a measurement, not a broken bench, so exit 1 passes too, without a
    traceback. Exactness and crashes are checked by the printed lines."""


SPARK = (pytest.mark.spark, pytest.mark.broker)
SMOKES = [
    pytest.param(
        Smoke(
            "codec_speed.py",
            ("--total-mib", "1", "--repeat", "1", "--sizes", "1024"),
            (
                r"codecs bench: Python .*, 1 MiB per size, blocks of 67,108,864 bytes, best of 1",
                rf"encode 1KiB: {NUMBER} MB/s vs bytes copy {NUMBER} MB/s \(ratio {NUMBER}; 1,024 entries, "
                rf"{NUMBER} ns/entry\)",
                rf"decode 1KiB: {NUMBER} MB/s vs bytes copy {NUMBER} MB/s \(ratio {NUMBER}; 1,024 entries, "
                rf"{NUMBER} ns/entry\)",
            ),
        ),
        id="codec_speed",
    ),
    pytest.param(
        Smoke(
            "page_cost.py",
            ("--mb", "4", "--rounds", "1", "--dir", "{work}"),
            (
                rf"round 1: {NUMBER} CPU s for 4 MiB = {NUMBER} CPU s per GiB",
                rf"new-page writes: median {NUMBER} CPU s per GiB, min {NUMBER}, max {NUMBER} over 1 rounds",
            ),
        ),
        id="page_cost",
    ),
    pytest.param(
        Smoke(
            "segment_cost.py",
            ("--segments", "2", "--entries", "3", "--rounds", "1", "--dir", "{work}"),
            tuple(
                rf"  {path} +{sync} +{NUMBER} ms wall, +{NUMBER} ms CPU per segment \({NUMBER} us per entry\); "
                rf"{NUMBER} fsyncs, {NUMBER} syncfs; requests .*put \d+.*"
                for path in ("written whole", "multipart")
                for sync in ("group commit", "fsync per file", "without syncs")
            ),
        ),
        id="segment_cost",
    ),
    pytest.param(
        Smoke(
            "table_compaction.py",
            ("--syncs", "8", "--entries-per-sync", "3", "--min-files", "2", "--maintain-every", "4", "--dir", "{work}"),
            (
                rf"before compaction: \d+ data files per partition \(max\), \d+ in 1 partition\(s\); sync p50 "
                rf"{NUMBER} ms, p99 {NUMBER} ms",
                rf"maintained every 4 syncs: at most \d+ data files per partition at any sync, {NUMBER} s of "
                "maintenance in all",
                rf"after compaction: 1 data files per partition \(max\), 1 in 1 partition\(s\); compaction {NUMBER} s "
                r"for \d+ file\(s\)",
                r"rows: 24 in the table, 24 offloaded \(exact\)",
            ),
        ),
        id="table_compaction",
    ),
    pytest.param(
        Smoke(
            "table.py",
            (
                *("--parts", "a,c", "--segments", "5", "--entries-per-segment", "10", "--messages-per-entry", "2"),
                *("--rounds", "1", "--syncs", "12"),
                *("--entries-per-sync", "3", "--maintain-every", "20s", "--min-files", "2", "--work-dir", "{work}"),
            ),
            (
                rf"  table \(sync_topic\) +100 rows in +{NUMBER} s +{NUMBER} rows/s  \(CPU {NUMBER} s; 1 commits, "
                rf"5 data files, {NUMBER} B; rounds {NUMBER} s/CPU {NUMBER} s\)",
                rf"  previous sync +100 rows in +{NUMBER} s +{NUMBER} rows/s  \(CPU {NUMBER} s; pyiceberg's writer, 5 "
                rf"data files; rounds {NUMBER} s/CPU {NUMBER} s\)",
                rf"  pyarrow alone \(zstd\) +100 rows in +{NUMBER} s +{NUMBER} rows/s  \(CPU {NUMBER} s; 5 files, "
                rf"{NUMBER} B; rounds {NUMBER} s/CPU {NUMBER} s\)",
                rf"  pyarrow, the table's settings +100 rows in +{NUMBER} s +{NUMBER} rows/s  \(zstd, no dictionary "
                rf"for __messageId, value; {NUMBER} B\)",
                rf"  table ÷ pyarrow: {NUMBER} \(target >= 0.5\) (met|MISSED); by CPU {NUMBER}; the previous sync "
                rf"{NUMBER}, by CPU {NUMBER}; sync ÷ previous {NUMBER}x by wall, {NUMBER}x by CPU",
                rf"  table ÷ pyarrow with the table's settings: {NUMBER} \(the target's reference is pyarrow's own "
                r"settings, above\)",
                rf"  the sync with reads that cost nothing \(each read task's batches replayed from memory\), best of "
                rf"1: {NUMBER} s, table ÷ pyarrow {NUMBER}: what the rest of the sync \(writing, committing\) allows "
                r"any faster reader",
                r"  data files per partition: at most 4 after any sync \(bound 7: .*\), \d+ now, .*",
                r"  2 maintenances, \d+ files compacted, 0 failed; syncs 12 .*",
                r"  rows: 36 in the table, 36 offloaded \(exact\)",
            ),
            verdict=True,
        ),
        id="table_ac",
    ),
    pytest.param(
        Smoke(
            "fuzz.py",
            ("--seed", "52", "--count", "2", "--kinds", "payload-lz4,lease", "--work-dir", "{work}"),
            (
                r"fuzz: seed 52, 2 inputs per kind, kinds payload-lz4, lease",
                r"kind +inputs +clean +refused +violations +max peak B +s",
                rf"payload-lz4 +2 +\d +\d +0 +{NUMBER} +{NUMBER}",
                rf"lease +2 +\d +\d +0 +{NUMBER} +{NUMBER}",
                rf"allocation bound 12,582,912 bytes \(tracemalloc peak per input\); process peak RSS {NUMBER} KiB",
            ),
        ),
        id="fuzz",
    ),
    pytest.param(
        Smoke(
            "read.py",
            (
                *("--size-mib", "2", "--s3-size-mib", "1", "--min-entry-kib", "4", "--max-entry-kib", "16"),
                *("--segment-mib", "1", "--s3-segment-mib", "1", "--block-mib", "1", "--s3-big-buffer-mib", "1"),
                *("--repeat", "1", "--s3-repeat", "1", "--random-reads", "10", "--cold-reads", "5"),
                *("--s3-random-reads", "5", "--latency-ms", "1", "--work-dir", "{work}"),
            ),
            (
                rf"filesystem backlog: {NUMBER} entries, 2 MiB of entries in \d+ segments .*",
                rf"catch-up read \(default .*\): {NUMBER} entries/s, {NUMBER} MB/s of entries .* vs raw sequential "
                rf"read {NUMBER} MB/s \(ratio {NUMBER}\)",
                rf"random entry read, warm reader \(10 reads\): p50 {NUMBER} ms, p99 {NUMBER} ms vs raw pread .*",
                rf"random entry read, cold reader \(5 reads; .*\): p50 {NUMBER} ms, p99 {NUMBER} ms",
                rf"simulated remote store .*: read-ahead .* {NUMBER} MB/s vs no read-ahead {NUMBER} MB/s .*",
                rf"S3 catch-up read \(read-ahead thread \(default for S3\), .*\): {NUMBER} entries/s, .* vs plain GET "
                rf"of each whole object {NUMBER} MB/s .*",
                rf"S3 random entry read, warm reader \(5 reads, cache 64 MiB\): p50 {NUMBER} ms, p99 {NUMBER} ms",
            ),
            needs=("moto",),
        ),
        id="read",
        marks=pytest.mark.s3,
    ),
    pytest.param(
        Smoke(
            "source.py",
            ("--messages", "200", "--no-spark", "--repeat", "1", "--readers", "plain,client,raw"),
            (
                rf"unbatched: published in {NUMBER} s \({NUMBER} msg/s\)",
                rf"  plain +200 entries in +{NUMBER} s: +{NUMBER} entries/s +{NUMBER} MB/s",
                rf"  client +200 entries in +{NUMBER} s: +{NUMBER} entries/s +{NUMBER} MB/s +ratio {NUMBER}",
                rf"  raw +200 entries in +{NUMBER} s: +{NUMBER} entries/s +{NUMBER} MB/s +ratio {NUMBER}",
                rf"batched: published in {NUMBER} s \({NUMBER} msg/s\)",
                rf"  raw +2 entries in +{NUMBER} s: +{NUMBER} entries/s +{NUMBER} MB/s +ratio {NUMBER}",
            ),
        ),
        id="source",
        marks=pytest.mark.broker,
    ),
    pytest.param(
        Smoke(
            "ceiling.py",
            (
                *("--no-shape", "--no-job", "--no-s3", "--mb", "2", "--repeat", "1", "--partitions", "1"),
                *("--store-part-mb", "1", "--store-segment-mb", "1"),
            ),
            (
                r"topic: \d+ entries, 2.\d MB of entry bytes \(raw reader; 2.0 MB of payload\)",
                rf"  plain \(pulsar-client drain\) +{NUMBER} MB in +{NUMBER} s +{NUMBER} MB/s",
                rf"  raw \(read_range_raw\) +{NUMBER} MB in +{NUMBER} s +{NUMBER} MB/s  ratio +{NUMBER}",
                rf"  raw ×2 \(two read_range_raw drains\) +{NUMBER} MB in +{NUMBER} s +{NUMBER} MB/s  ratio +{NUMBER}",
                rf"  store fs \(FilesystemStore, fsync\) +{NUMBER} MB in +{NUMBER} s +{NUMBER} MB/s  ratio +{NUMBER}",
            ),
        ),
        id="ceiling-no-spark",
        marks=pytest.mark.broker,
    ),
    pytest.param(
        Smoke(
            "dataframe.py",
            (
                *("--direct", "--store-mb", "1", "--partitions", "1", "--runs", "1"),
                *("--block-mib", "1", "--segment-mib", "1", "--work-dir", "{work}"),
            ),
            (
                r"dataframe bench: .*, store of 1 MB \(\d+ data objects, .*; 1 topic-partitions; .*\), built in .*",
                rf"OffloadedReader.read called directly \(1 process, no Spark\): {NUMBER} messages, best of \d+: "
                rf"{NUMBER} s wall, {NUMBER} s CPU = {NUMBER} µs per message wall, {NUMBER} µs CPU; .*",
            ),
        ),
        id="dataframe-direct",
    ),
    pytest.param(
        Smoke(
            "scale.py",
            ("--topics", "10", "--create-only", "--probes", "2"),
            (
                r"== 10 topic-partitions",
                rf"  created on pulsar-lite +12 topic-partitions in {NUMBER} s .*",
                rf"  discovery \(this process\) +first {NUMBER} s, again {NUMBER} s \(found 12; .*",
                r"\| exactly once \| - \|.*",
            ),
        ),
        id="scale-create-only",
        marks=pytest.mark.broker,
    ),
    pytest.param(
        Smoke(
            "subscribe_cost.py",
            ("--rounds", "1", "--reads", "5", "--entries", "50"),
            (
                r"   entries subscriptions  names reused  fresh names  fresh ÷ reused",
                rf" +50 +10 +{NUMBER} ms +{NUMBER} ms +({NUMBER}|-)",
            ),
        ),
        id="subscribe_cost",
        marks=pytest.mark.broker,
    ),
    pytest.param(
        Smoke(
            "broker_cost.py",
            ("--backlog-mb", "2", "--rounds", "1", "--asks", "3"),
            (
                rf"broker_cost: 2 MB in 4 topic-partitions, 1 round\(s\); load {NUMBER}",
                rf" +plain: broker +{NUMBER} CPU s/GB \(({NUMBER}|-) x plain's {NUMBER}\), +{NUMBER} MB/s",
                rf" +source tasks: broker +{NUMBER} CPU s/GB \(({NUMBER}|-) x plain's {NUMBER}\), +{NUMBER} MB/s",
                rf" +latest x 3: broker {NUMBER} CPU ms per lookup of 4 topic-partitions \(held consumers\), "
                rf"{NUMBER} ms wall each",
            ),
        ),
        id="broker_cost",
        marks=pytest.mark.broker,
    ),
]

# The benches that start Spark (a JVM and its Python workers: 15-20 s on a calm machine, minutes on a loaded one)
# or a job process that must converge, or Apache Pulsar: their smoke sizes are as small as their arguments go.
SLOW_SMOKES = [
    pytest.param(
        Smoke(
            "table.py",
            (
                *("--parts", "b,d,e", "--minutes", "0.25", "--rate", "200", "--backlog-mb", "4", "--segment-mb", "1"),
                *("--runs", "1", "--work-dir", "{work}"),
            ),
            (
                rf"  table behind the store \(snapshot commit - segment commit\) over \d+ segments in \d+ snapshots: "
                rf"p50 {NUMBER} s, p99 {NUMBER} s, max {NUMBER} s \(target p99 <= 30 s\) (met|MISSED)",
                r"  rows: 3,000 in the table, 3,000 published \(exact\)",
                rf"  round 1 sync off: {NUMBER} MB in \d+ segments in {NUMBER} s = {NUMBER} MB/s steady .*",
                rf"  round 1 sync on : {NUMBER} MB in \d+ segments in {NUMBER} s = {NUMBER} MB/s steady .*the table "
                r"caught up .*",
                rf"  steady rate, sync on ÷ off: {NUMBER} ÷ {NUMBER} MB/s = {NUMBER} .*",
                rf"  DuckDB ÷ Spark time: {NUMBER} \(Spark takes {NUMBER}x\); results equal",
            ),
            verdict=True,
        ),
        id="table_bde",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "ceiling.py",
            (
                *("--no-shape", "--mb", "2", "--repeat", "1", "--partitions", "1", "--no-s3"),
                *("--store-part-mb", "1", "--store-segment-mb", "1"),
            ),
            (
                rf"positions job warm-up \(run_once on a small topic\): {NUMBER} s",
                rf"  plain \(pulsar-client drain\) +{NUMBER} MB in +{NUMBER} s +{NUMBER} MB/s",
                rf"  raw ×2 \(two read_range_raw drains\) +{NUMBER} MB in +{NUMBER} s +{NUMBER} MB/s  ratio +{NUMBER}",
                rf"  store fs \(FilesystemStore, fsync\) +{NUMBER} MB in +{NUMBER} s +{NUMBER} MB/s  ratio +{NUMBER}",
                rf"  positions job \(run_once, fs store\) +{NUMBER} MB in +{NUMBER} s +{NUMBER} MB/s  ratio +{NUMBER}"
                rf"  \(wall {NUMBER} s\)",
                rf"      CPU s per GB: jvm \+ python workers {NUMBER}, broker {NUMBER}, .*",
            ),
        ),
        id="ceiling",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "offload.py",
            # S3 on moto (bench/harness.py's moto_bucket); ceiling's positions job line covers the filesystem store.
            (
                *("--backlog-mb", "1", "--partitions", "1", "--skip-lag", "--repeat", "1", "--store", "s3"),
                *("--work-dir", "{work}"),
            ),
            (
                r"offload bench: .*, S3 \(moto_server\) store; .*",
                rf"warm-up \(source and job on a small topic\): {NUMBER} s",
                r"throughput: published 244 messages of 4096 B \(1 MB of payload\) to 1 topic-partitions in .*",
                rf"  reference: plain pulsar-client drain 5: {NUMBER} s \({NUMBER} MB/s of payload\)",
                rf"  reference: raw-reader drain: {NUMBER} s \({NUMBER} MB/s of payload\)",
                rf"  round 1, overlap off: run --once {NUMBER} MB/s, steady {NUMBER} MB/s .*",
                rf"  round 1, overlap on: run --once {NUMBER} MB/s, steady {NUMBER} MB/s .*",
                rf"  the broker's best reader \(fresh broker\): {NUMBER} MB/s \(plain best of 5 .*",
                rf"  overlap off: steady {NUMBER} MB/s, ÷ best reader {NUMBER}; run --once {NUMBER} MB/s; job tree CPU "
                rf"{NUMBER} s/GB .*",
                rf"  overlap on : steady {NUMBER} MB/s, ÷ best reader {NUMBER}; .*",
                rf"  overlap on ÷ off, steady: {NUMBER} .*",
                rf"  round 1, raw aiobotocore multipart: 1 objects as the job's data objects \({NUMBER} MB, .*\), "
                rf"1 parts of at most 8 MiB .*, 1 at once: {NUMBER} s = {NUMBER} MB/s .*; moto CPU {NUMBER} s .*",
                rf"  S3 on par \(moto\): raw aiobotocore multipart {NUMBER} MB/s .*",
                rf"  overlap off: job steady {NUMBER} MB/s ÷ raw {NUMBER} \(target >= 0.7\) (met|MISSED); sink per "
                rf"thread {NUMBER} MB/s .* ÷ raw per part upload {NUMBER}; moto CPU {NUMBER} s/GB",
                rf"  overlap on : job steady {NUMBER} MB/s ÷ raw {NUMBER} \(target >= 0.7\) (met|MISSED); .*",
            ),
            needs=("moto",),
        ),
        id="offload",
        marks=(*SPARK, pytest.mark.s3, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "cluster.py",
            # The packed environment of tests/cluster/ (var/cluster-env/, packed by README's commands when missing).
            ("--backlog-mb", "2", "--partitions", "1", "--plain-rounds", "1", "--work-dir", "{work}"),
            (
                r"cluster bench: load .*",
                r"published 1,953 messages of 1024 B to 1 topic-partitions",
                rf"  plain pulsar-client drain 1 +{NUMBER} MB/s .* broker CPU +{NUMBER} s/GB",
                rf"  raw drain +{NUMBER} MB/s .* broker CPU +{NUMBER} s/GB",
                rf"  local\[2\] \(spool\) +{NUMBER} MB/s steady .* ÷ reference {NUMBER} +broker CPU +{NUMBER} s/GB .*",
                rf"  standalone cluster, 2 workers \(re-read\) +{NUMBER} MB/s steady .* ÷ reference {NUMBER} .*",
                rf"  cluster ÷ local\[2\]: steady {NUMBER}, broker CPU per GB {NUMBER}",
            ),
        ),
        id="cluster",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "empty_run.py",
            ("--messages", "20", "--partitions", "1"),
            (
                rf"first run \(offloads 1 x 20 messages\): exit 0, {NUMBER} s wall",
                rf"nothing new: exit 0, {NUMBER} s wall",
                rf"nothing new, again: exit 0, {NUMBER} s wall",
            ),
        ),
        id="empty_run",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "start_time.py",
            ("--backlog-mb", "2", "--runs", "1"),
            (
                rf"run 1 \(2 MB\): {NUMBER} s wall, broker CPU {NUMBER} s",
                rf" +{NUMBER} s +micro-batch's foreachBatch 1: start",
                rf"  reference: plain pulsar-client drain 5: {NUMBER} s \({NUMBER} MB/s of payload\)",
                rf"  reference: raw-reader drain: {NUMBER} s \({NUMBER} MB/s of payload\)",
                rf" +first read at {NUMBER} s; 2 MB: {NUMBER} MB/s from launch, {NUMBER} MB/s from the first read",
                rf" +÷ the broker's best reader \({NUMBER} MB/s\): from launch {NUMBER} \(target >= 0.4\), from the "
                rf"first read {NUMBER}",
                rf"nothing new: {NUMBER} s wall, broker CPU {NUMBER} s",
            ),
        ),
        id="start_time",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "rate_limit.py",
            ("--rate-mb", "1", "--seconds", "6", "--entry-kib", "16", "--topics", "2"),
            (
                r"rate-limit bench: total upload limit 1 MB/s, 2 topic-partition\(s\), continuous, 6 s measured;"
                r" work .*",
                r"published \d+ entries of 16384 bytes \(\d+ MB\) in .*",
                rf"\d+ MB \(bytes of data objects\) in {NUMBER} s: {NUMBER} MB/s vs target 1"
                rf" \([-+]{NUMBER}%\) (OK|OUT)",
                rf"window +0- +5 s: +{NUMBER} MB/s \([-+]{NUMBER}%\)",
                r"result: (within ±10% of the target|OUTSIDE ±10%)",
            ),
            verdict=True,
        ),
        id="rate_limit",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "dataframe.py",
            (
                *("--store-mb", "2", "--partitions", "1", "--runs", "1", "--block-mib", "1", "--segment-mib", "1"),
                *("--work-dir", "{work}"),
            ),
            (
                rf"raw sequential read of the data objects: +{NUMBER} s +{NUMBER} MB/s  \(reference\)",
                rf"spark count\(\): +{NUMBER} s +{NUMBER} MB/s  ratio {NUMBER}  \(1,860 messages\)",
                rf"spark scan of value: +{NUMBER} s +{NUMBER} MB/s  ratio {NUMBER}  \(2 MB of values\)",
                rf"TopicReader scan of value \(1 process\): +{NUMBER} s +{NUMBER} MB/s  ratio {NUMBER}",
                rf"1% publish-time window: read {NUMBER} MB of the 2 MB store \({NUMBER}%, must be < 3%\); spark "
                rf"count\(\) {NUMBER} s, 10 messages \({NUMBER}% of them\)",
            ),
        ),
        id="dataframe",
        marks=(pytest.mark.spark, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "chaos.py",
            ("--faults", "1", "--kinds", "policy-live", "--rate", "50", "--max-delay", "0.5", "--work-dir", "{work}"),
            (
                r"  fault kind +injected +survived",
                r"  policy-live +1 +1",
                r"  published \(acked\) +([\d,]+)\n  stored +\1 in [\d,]+ Offloaded segments",
                *(rf"  {figure} +0" for figure in ("missing", "duplicated", "corrupt", "out of order")),
                r"  verify --crc +clean",
                r"  cleanup +removed \d+, orphans left 0, Offloaded segments lost 0, .*",
                r"  result +OK",
            ),
        ),
        id="chaos",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "scale.py",
            (
                *("--topics", "20", "--active", "10", "--rate", "100", "--minutes", "0.25", "--warmup-s", "5"),
                *("--rotate-s", "10", "--idle-s", "10", "--settle-s", "2", "--probes", "2", "--seed-messages", "0"),
                *("--startup-timeout", "400", "--step-minutes", "4"),
            ),
            (
                r"== 20 topic-partitions",
                rf"  start-up: {NUMBER} s until every topic-partition had a segment Offloaded",
                r"  traffic done: [\d,]+ acknowledged in .*",
                rf"  lag of active topics +p50 {NUMBER} s, p99 {NUMBER} s, max {NUMBER} s .*",
                rf"  one /metrics scrape +{NUMBER} series .*",
                r"  exactly once +OK: ([\d,]+) acknowledged, \1 stored .*",
                r"\| exactly once \| OK \|.*",
            ),
        ),
        id="scale",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "soak.py",
            (
                *("--minutes", "0.5", "--rate", "100", "--partitions", "4", "--sample-s", "5", "--gc-every-s", "15"),
                *("--out", "{work}"),
            ),
            (
                r"soak: 0.5 min, 100 msg/s over 4 topic-partitions, rollover 5 s; judged after a warm-up of .*",
                r"  series +mean +min +max +slope %/.* +verdict",
                rf"  JVM RSS \(MiB\) +{NUMBER} .*",
                rf"  lag \(publish to Offloaded\)  p50 {NUMBER} s  p99 {NUMBER} s  max {NUMBER} s .*",
                r"  exactly once  published ([\d,]+), stored \1, missing 0, duplicated 0, corrupt 0, out of order 0",
                r"  OK      every message in the store exactly once: ([\d,]+) acknowledged, \1 stored",
                r"  OK      the job ran throughout and converged: converged",
                r"  (OK|FAILED)  resources flat after warm-up: .*",
            ),
            verdict=True,
        ),
        id="soak",
        marks=(*SPARK, pytest.mark.slow),
    ),
    pytest.param(
        Smoke(
            "pulsar_offloader.py",
            ("--backlog-mb", "1", "--ledger-entries", "5", "--work-dir", "{work}"),
            (
                rf"Apache Pulsar {re.escape(PULSAR_VERSION)} standalone up in {NUMBER} s; moto at .*; offloader "
                rf"tiered-storage-jcloud-{re.escape(OFFLOADER_VERSION)}\.nar",
                r"published 244 messages of 4096 B batched by 32 \(1 MB of payload\) in .*; \d+ closed ledgers, .*",
                *(
                    rf"{side} +{NUMBER} MB/s +{NUMBER} CPU s/GB \(moto apart\)  publish to readable +{NUMBER} s .*"
                    for side in ("ours -> fs", "ours -> s3", "pulsar -> s3")
                ),
                rf"to the same moto, ours / Pulsar's: {NUMBER}x the MB/s, {NUMBER}x the CPU s per GB \(moto apart\)",
            ),
            needs=("moto", "pulsar", "offloader"),
        ),
        id="pulsar_offloader",
        marks=(pytest.mark.pulsar, pytest.mark.spark, pytest.mark.s3, pytest.mark.slow),
    ),
]
SLOW_BENCHES = [p.values[0] for p in SLOW_SMOKES]


def _check_needs(needs: tuple[str, ...]) -> None:
    if "moto" in needs and moto_command() is None:
        missing_tool(f"moto_server not found beside {sys.executable} (pip install 'moto[server]')")
    if "pulsar" in needs and not (pulsar_lib_dir() / f"pulsar-broker-{PULSAR_VERSION}.jar").is_file():
        missing_tool(
            f"Apache Pulsar {PULSAR_VERSION} is not resolved in {pulsar_lib_dir()} (bash scripts/pulsar.sh fetch)"
        )
    if "offloader" in needs and not offloader_jar().is_file():
        missing_tool(f"Pulsar's jcloud offloader {offloader_jar()} is not resolved ({build_command()})")


@pytest.mark.parametrize("smoke", SMOKES + SLOW_SMOKES)
def test_the_bench_runs_at_its_smoke_size_and_prints_its_figures(
    smoke: Smoke, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if smoke in SLOW_BENCHES and not request.config.getoption("--slow-benches"):
        pytest.skip("a Spark or Apache Pulsar bench: runs with --slow-benches (its --help runs in every suite)")
    _check_needs(smoke.needs)
    work = tmp_path / "work"
    work.mkdir()
    command = [sys.executable, f"bench/{smoke.bench}", *(a.replace("{work}", str(work)) for a in smoke.args)]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    output = f"$ {' '.join(command)}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    allowed = (0, 1) if smoke.verdict else (0,)
    assert proc.returncode in allowed and "Traceback" not in proc.stderr, output
    missing = [p for p in smoke.prints if not re.search(f"^{p}$", proc.stdout, re.MULTILINE)]
    assert not missing, f"no line matches {missing}\n{output}"


@pytest.mark.parametrize("bench", sorted({s.bench for s in SLOW_BENCHES}))
def test_every_slow_bench_starts_and_teaches(bench: str) -> None:
    """The benches the default suite does not run at their smoke size still import and parse their arguments, in
    their own process: a broken import or option fails here."""
    proc = subprocess.run(
        [sys.executable, f"bench/{bench}", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: "), f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"


def test_no_bench_imports_the_test_tree() -> None:
    """A bench runs without pytest and the test tree: what the benches share with the tests lives in bench/."""
    offenders = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            offenders += [
                f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in ("tests", "pytest")
            ]
    assert not offenders, offenders
