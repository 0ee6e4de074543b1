package io.kvpool.cli;

import io.kvpool.client.KvPoolClient;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;

import java.util.concurrent.Callable;

/** {@code kvpool rm}: remove one key, a prefix, or everything. */
@Command(name = "rm", mixinStandardHelpOptions = true,
        description = "Remove one key, every key with a prefix (--prefix), or everything (--all).")
final class RmCommand implements Callable<Integer> {

    @CommandLine.Spec
    CommandLine.Model.CommandSpec spec;

    @Mixin
    ClientOptions client;

    @Parameters(index = "0", arity = "0..1", paramLabel = "KEY", description = "The key to remove.")
    String key;

    @Option(names = "--prefix", paramLabel = "PREFIX", description = "Remove every key starting with PREFIX.")
    String prefix;

    @Option(names = "--all", description = "Remove every object.")
    boolean all;

    @Option(names = "--force", description = "With --all: also fence puts in flight (a new cluster epoch).")
    boolean force;

    @Override
    public Integer call() {
        int modes = (key != null ? 1 : 0) + (prefix != null ? 1 : 0) + (all ? 1 : 0);
        if (modes != 1) {
            throw new CommandLine.ParameterException(spec.commandLine(), "give exactly one of KEY, --prefix or --all");
        }
        if (force && !all) {
            throw new CommandLine.ParameterException(spec.commandLine(), "--force goes with --all");
        }
        try (KvPoolClient c = client.connect()) {
            if (key != null) {
                boolean removed = c.remove(key);
                System.out.println(removed ? "removed " + key : "not found: " + key);
                return removed ? 0 : 1;
            }
            long n = all ? c.removeAll(force) : c.removeByPrefix(prefix);
            System.out.println("removed " + n + " objects" + (all && force ? " (new epoch: puts in flight fenced)" : ""));
            return 0;
        }
    }
}
