package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutInParts;
import io.kvpool.client.PutOptions;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import picocli.CommandLine;
import picocli.CommandLine.ArgGroup;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

import java.lang.foreign.MemorySegment;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.ThreadLocalRandom;

/** {@code kvpool put}: store one object (debugging). */
@Command(name = "put", mixinStandardHelpOptions = true, description = "Store one object (for debugging).")
final class PutCommand implements Callable<Integer> {

    @Mixin
    ClientOptions client;

    @Parameters(index = "0", paramLabel = "KEY", description = "The key (UTF-8, at most 512 bytes).")
    String key;

    static final class Source {
        @Option(names = "--value", paramLabel = "TEXT", description = "Store this text.")
        String text;
        @Option(names = "--file", paramLabel = "PATH", description = "Store this file's bytes.")
        Path file;
        @Option(names = "--random", paramLabel = "SIZE", description = "Store this many random bytes.")
        Size random;
    }

    @ArgGroup(exclusive = true, multiplicity = "1")
    Source source;

    @Option(names = "--upsert", description = "Replace the object if the key is present.")
    boolean upsert;

    @Option(names = "--parts", paramLabel = "N", description = "Write the value in N parts of equal size (the last one"
            + " takes the rest), last part first, as a put in parts: what a layer-by-layer save does.")
    int parts;

    /** The largest byte array the JVM can allocate (a few bytes under Integer.MAX_VALUE). */
    static final long MAX_RANDOM_BYTES = Integer.MAX_VALUE - 8;

    @CommandLine.Spec
    CommandLine.Model.CommandSpec spec;

    @Override
    public Integer call() throws Exception {
        byte[] value = null;
        if (source.text != null) {
            value = source.text.getBytes(StandardCharsets.UTF_8);
        } else if (source.file != null) {
            if (!Files.isRegularFile(source.file)) {
                throw new IllegalArgumentException("--file " + source.file + ": no such file");
            }
            value = Files.readAllBytes(source.file);
        } else if (source.random.bytes() > MAX_RANDOM_BYTES) {
            throw tooLarge("kvpool put holds the value in memory, at most " + MAX_RANDOM_BYTES
                    + " bytes (just under 2GiB)");
        }
        try (KvPoolClient c = client.connect()) {
            if (value == null) {
                // checked before the bytes are allocated; the client would refuse them anyway
                if (source.random.bytes() > c.maxValueBytes()) {
                    throw tooLarge("the pool accepts at most " + Size.ofBytes(c.maxValueBytes())
                            + " (the master's --max-value-size)");
                }
                value = new byte[(int) source.random.bytes()];
                ThreadLocalRandom.current().nextBytes(value);
            }
            PutStatus st = parts > 0 ? putInParts(c, value) : upsert ? c.upsert(key, value) : c.put(key, value);
            System.out.println(st + " " + key + " (" + value.length + " bytes)");
            return st == PutStatus.OK ? 0 : 1;
        }
    }

    private PutStatus putInParts(KvPoolClient c, byte[] value) {
        if (upsert) {
            throw new CommandLine.ParameterException(spec.commandLine(), "--parts writes a new object; it cannot upsert");
        }
        long size = value.length / parts;
        try (PutInParts put = c.beginPut(List.of(key), new long[]{value.length}, PutOptions.DEFAULT)) {
            for (int p = parts - 1; p >= 0; p--) {
                long from = p * size;
                long to = p == parts - 1 ? value.length : from + size;
                put.write(0, from, MemorySegment.ofArray(value).asSlice(from, to - from));
            }
            return put.finish().getFirst();
        }
    }

    private CommandLine.ParameterException tooLarge(String limit) {
        // as the user wrote it: 9TB, not 8789062500KiB
        CommandLine.Model.OptionSpec opt = spec.commandLine().getParseResult().matchedOption("--random");
        String given = opt == null || opt.originalStringValues().isEmpty() ? source.random.toString()
                : opt.originalStringValues().getLast();
        return new CommandLine.ParameterException(spec.commandLine(), "--random " + given + " is too large: " + limit);
    }
}
