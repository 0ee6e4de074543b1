package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

import java.lang.foreign.MemorySegment;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Optional;
import java.util.concurrent.Callable;

/** {@code kvpool get}: read one object (debugging). Exit code 1 on a miss. */
@Command(name = "get", mixinStandardHelpOptions = true,
        description = "Read one object (for debugging). Prints it, or writes it to --out. Exit code 1 on a miss.")
final class GetCommand implements Callable<Integer> {

    @Mixin
    ClientOptions client;

    @Parameters(index = "0", paramLabel = "KEY", description = "The key.")
    String key;

    @Option(names = "--out", paramLabel = "PATH", description = "Write the value to this file instead of stdout.")
    Path out;

    @Option(names = "--range", paramLabel = "OFFSET:LENGTH", description = "Read only LENGTH bytes from OFFSET of the"
            + " value (a ranged read, as a layer-by-layer load reads one layer of a block).")
    String range;

    @Override
    public Integer call() throws Exception {
        Optional<byte[]> v;
        try (KvPoolClient c = client.connect()) {
            v = range == null ? c.get(key) : readRange(c);
        }
        if (v.isEmpty()) {
            System.err.println("miss: " + key);
            return 1;
        }
        if (out != null) {
            Files.write(out, v.get());
            System.err.println("wrote " + v.get().length + " bytes to " + out);
        } else {
            System.out.write(v.get());
            System.out.flush();
        }
        return 0;
    }

    private Optional<byte[]> readRange(KvPoolClient c) {
        String[] parts = range.split(":", -1);
        long offset;
        int length;
        try {
            if (parts.length != 2) {
                throw new NumberFormatException();
            }
            offset = Long.parseLong(parts[0]);
            length = Integer.parseInt(parts[1]);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("--range " + range + ": expected OFFSET:LENGTH in bytes, e.g. 65536:65536");
        }
        if (length < 0) {
            throw new IllegalArgumentException("--range " + range + ": the length is negative");
        }
        byte[] out = new byte[length];
        return c.getRangeInto(key, offset, MemorySegment.ofArray(out)) == KvPoolClient.MISS ? Optional.empty()
                : Optional.of(out);
    }
}
