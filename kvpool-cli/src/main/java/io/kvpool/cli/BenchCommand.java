package io.kvpool.cli;

import io.kvpool.bench.Bench;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

import java.nio.file.Path;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.Callable;

/** {@code kvpool bench}: measurements against this machine's ceilings and Redis (not tests). */
@Command(name = "bench", mixinStandardHelpOptions = true,
        description = {"Measure kvpool against raw memory copy, raw loopback TCP and Redis 7, all in one run.",
                "Sections: store (put/get GB/s and latency), lookup (batchExists/prefixMatch of 1024 keys),",
                "metadata (10M objects in one master), reset (removeAll of 1M objects),",
                "disk (SSD tier spill and read-back vs fio on the same directory),",
                "tls (put/get in mutual TLS vs plain TCP, same run; needs openssl).",
                "Redis is installed from Debian's packages and started on loopback by scripts/redis.sh."})
final class BenchCommand implements Callable<Integer> {

    @Option(names = "--quick", description = "A short run (about a minute): 1 MiB values, 1 and 2 clients,"
            + " 1M objects for metadata.")
    boolean quick;

    @Option(names = "--only", split = ",", paramLabel = "SECTION",
            description = "Run only these sections (store, lookup, metadata, reset, disk, restore, python, mooncake, failover,"
                    + " replicas, tls, rolling, restarts, degraded, scale); default: all.")
    List<String> only;

    @Option(names = "--out", paramLabel = "DIR",
            description = "Where to write results.json, results.csv and the charts (default: ${DEFAULT-VALUE}).")
    Path out = Path.of("bench-results");

    @Option(names = "--disk-dir", paramLabel = "DIR",
            description = "Directory for the disk section (the SSD tier and fio write there; default: ${DEFAULT-VALUE}).")
    Path diskDir = Path.of("bench-results", "disk");

    @Override
    public Integer call() throws Exception {
        Set<String> sections = only == null || only.isEmpty() ? Bench.Options.ALL : new LinkedHashSet<>(only);
        for (String s : sections) {
            if (!Bench.Options.ALL.contains(s)) {
                throw new IllegalArgumentException("--only " + s + ": no such section; the sections are "
                        + new java.util.TreeSet<>(Bench.Options.ALL));
            }
        }
        Bench.run(new Bench.Options(quick, sections, out, System.out, diskDir));
        return 0;
    }
}
