package io.kvpool.cli;

import io.kvpool.master.MasterServer;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;

/** {@code kvpool master}: the metadata service alone. */
@Command(name = "master", mixinStandardHelpOptions = true,
        description = "Run the master: metadata, placement, eviction, membership, metrics. No object bytes pass through it.")
final class MasterCommand implements Callable<Integer> {

    @Option(names = "--host", paramLabel = "ADDRESS", description = "Address to listen on (default: ${DEFAULT-VALUE}).")
    String host = "0.0.0.0";

    @Mixin
    MasterOptions options;

    @Override
    public Integer call() throws Exception {
        CountDownLatch stop = new CountDownLatch(1);
        MasterServer master = new MasterServer(options.toConfig(host));
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            master.close();
            stop.countDown();
        }, "kvpool-shutdown"));
        System.out.printf("kvpool master listening on %s:%d, metrics on port %d%n", host, master.port(), master.httpPort());
        System.out.flush();
        stop.await();
        return 0;
    }
}
