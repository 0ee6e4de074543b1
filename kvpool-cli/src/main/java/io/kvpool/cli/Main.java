package io.kvpool.cli;

import io.kvpool.config.Durations;
import io.kvpool.config.HostPort;
import io.kvpool.config.Size;
import io.kvpool.engine.EngineServer;
import io.kvpool.etcd.MasterAddress;
import picocli.CommandLine.Command;
import picocli.CommandLine;

import java.time.Duration;
import java.util.function.Function;

/**
 * The {@code kvpool} command. Exit codes: 0 success, 1 failure at run time (the message says what
 * failed), 2 bad flags or values (the message names the flag).
 */
@Command(name = "kvpool", mixinStandardHelpOptions = true, versionProvider = Main.Version.class,
        description = "A distributed, tiered KV-cache pool for LLM inference and RL rollouts.",
        subcommands = {ServeCommand.class, MasterCommand.class, NodeCommand.class, StatusCommand.class,
                PutCommand.class, GetCommand.class, RmCommand.class, DemoCommand.class, PoolDemoCommand.class, EngineCommand.class,
                LaunchCommand.class, RollingRestartCommand.class, TrainerCommand.class, OffloadConfigCommand.class,
                BenchCommand.class, SoakCommand.class,
                CommandLine.HelpCommand.class})
public final class Main implements Runnable {

    @CommandLine.Spec
    CommandLine.Model.CommandSpec spec;

    public static void main(String[] args) {
        EngineServer.limitRequestTime(); // before any HTTP server of this process starts
        System.exit(run(args));
    }

    /** Runs the command line and returns the exit code (for tests). */
    public static int run(String... args) {
        Logging.configure(args);
        return commandLine().execute(args);
    }

    static CommandLine commandLine() {
        CommandLine cl = new CommandLine(new Main());
        cl.registerConverter(Size.class, s -> convert(s, Size::parse));
        cl.registerConverter(Duration.class, s -> convert(s, Durations::parse));
        cl.registerConverter(HostPort.class, s -> convert(s, HostPort::parse));
        cl.registerConverter(MasterAddress.class, s -> convert(s, MasterAddress::parse));
        cl.setParameterExceptionHandler((ex, args) -> {
            CommandLine c = ex.getCommandLine();
            c.getErr().println("kvpool " + c.getCommandName() + ": " + ex.getMessage());
            c.getErr().println("try 'kvpool " + (c.getParent() == null ? "" : c.getCommandName() + " ") + "--help'");
            return CommandLine.ExitCode.USAGE;
        });
        cl.setExecutionExceptionHandler((ex, commandLine, parseResult) -> {
            if (ex instanceof IllegalArgumentException) {
                commandLine.getErr().println("kvpool " + commandLine.getCommandName() + ": " + ex.getMessage());
                return CommandLine.ExitCode.USAGE;
            }
            commandLine.getErr().println("kvpool " + commandLine.getCommandName() + ": " + ex.getMessage());
            if (System.getenv("KVPOOL_DEBUG") != null) {
                ex.printStackTrace(commandLine.getErr());
            }
            return CommandLine.ExitCode.SOFTWARE;
        });
        return cl;
    }

    /** Parses with our parser, so the message picocli prints is ours: "Invalid value for option '--x': <why>". */
    private static <T> T convert(String text, Function<String, T> parser) {
        try {
            return parser.apply(text);
        } catch (IllegalArgumentException e) {
            throw new CommandLine.TypeConversionException(e.getMessage());
        }
    }

    @Override
    public void run() {
        throw new CommandLine.ParameterException(spec.commandLine(), "missing command; try 'kvpool --help'");
    }

    static final class Version implements CommandLine.IVersionProvider {
        @Override
        public String[] getVersion() {
            String v = Main.class.getPackage().getImplementationVersion();
            return new String[]{"kvpool " + (v == null ? "development build" : v) + " on Java "
                    + Runtime.version()};
        }
    }
}
