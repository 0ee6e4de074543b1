package io.kvpool.cli;

import picocli.CommandLine;
import picocli.CommandLine.Command;

/** {@code kvpool bench}: measurements (not tests); each section is a subcommand. */
@Command(name = "bench", mixinStandardHelpOptions = true,
        description = "Measure kvpool on this machine.",
        subcommands = {BenchResetCommand.class})
final class BenchCommand implements Runnable {

    @CommandLine.Spec
    CommandLine.Model.CommandSpec spec;

    @Override
    public void run() {
        throw new CommandLine.ParameterException(spec.commandLine(), "name a benchmark, e.g. 'kvpool bench reset'");
    }
}
