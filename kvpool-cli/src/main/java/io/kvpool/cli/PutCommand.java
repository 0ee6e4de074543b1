package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PutStatus;
import io.kvpool.config.Size;
import picocli.CommandLine.ArgGroup;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
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

    @Override
    public Integer call() throws Exception {
        byte[] value;
        if (source.text != null) {
            value = source.text.getBytes(StandardCharsets.UTF_8);
        } else if (source.file != null) {
            if (!Files.isRegularFile(source.file)) {
                throw new IllegalArgumentException("--file " + source.file + ": no such file");
            }
            value = Files.readAllBytes(source.file);
        } else {
            value = new byte[Math.toIntExact(source.random.bytes())];
            ThreadLocalRandom.current().nextBytes(value);
        }
        try (KvPoolClient c = client.connect()) {
            PutStatus st = upsert ? c.upsert(key, value) : c.put(key, value);
            System.out.println(st + " " + key + " (" + value.length + " bytes)");
            return st == PutStatus.OK ? 0 : 1;
        }
    }
}
