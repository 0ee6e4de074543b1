package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

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

    @Override
    public Integer call() throws Exception {
        Optional<byte[]> v;
        try (KvPoolClient c = client.connect()) {
            v = c.get(key);
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
}
