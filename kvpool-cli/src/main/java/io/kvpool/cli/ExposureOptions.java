package io.kvpool.cli;

import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Secrets;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.file.Path;

/**
 * What a master's or node's port exposes, and to whom: connection limits, the secrets its peers
 * must prove, and TLS. One mixin per command ({@code serve} shares it between its master and node).
 *
 * <p>Fail closed: a server asked to listen on an address other than loopback without a cluster
 * secret refuses to start, unless {@code --insecure} says the operator means it.
 */
final class ExposureOptions {

    @Option(names = "--max-connections", paramLabel = "N",
            description = "Most connections the port keeps open; one more is told so and closed (default: ${DEFAULT-VALUE}).")
    int maxConnections = Limits.DEFAULT_MAX_CONNECTIONS;

    @Option(names = "--max-connections-per-host", paramLabel = "N",
            description = "Most connections from one peer address (default: ${DEFAULT-VALUE}).")
    int maxConnectionsPerHost = Limits.DEFAULT_MAX_CONNECTIONS_PER_HOST;

    @Option(names = "--secret-file", paramLabel = "FILE",
            description = "File holding the cluster secret every client, node and master proves it knows"
                    + " (default: env KVPOOL_SECRET_FILE or KVPOOL_SECRET). Never give a secret on the command line.")
    Path secretFile;

    @Option(names = "--admin-secret-file", paramLabel = "FILE",
            description = "File holding the admin secret: removals of everything or by prefix, and node administration"
                    + " (default: env KVPOOL_ADMIN_SECRET_FILE or KVPOOL_ADMIN_SECRET). Required with a cluster secret.")
    Path adminSecretFile;

    @Mixin
    TlsOptions tls;

    @Option(names = "--insecure",
            description = "Listen on a non-loopback address without secrets: anyone who reaches the port can read,"
                    + " overwrite or delete every key.")
    boolean insecure;

    /** {@code base} with these connection limits; IllegalArgumentException naming the flag when they are bad. */
    Limits apply(Limits base) {
        if (maxConnections != Limits.DEFAULT_MAX_CONNECTIONS) {
            // a value asked for; the default stays valid on a machine with a low open-file limit, as before
            Bounds.connections("--max-connections", maxConnections);
        }
        if (maxConnectionsPerHost < 1 || maxConnectionsPerHost > maxConnections) {
            throw new IllegalArgumentException("--max-connections-per-host must be between 1 and --max-connections ("
                    + maxConnections + "), got " + maxConnectionsPerHost);
        }
        return base.withConnections(maxConnections, maxConnectionsPerHost);
    }

    /**
     * The secrets of a {@code role} listening on {@code listenHost}: from the flags, else the
     * environment, with the TLS identity the TLS flags or the environment name. IllegalArgumentException
     * saying how to set them when the address is not loopback and there are none (unless
     * {@code --insecure}), when only one of the two is given, or naming a TLS file that is wrong.
     */
    Secrets secrets(String role, String listenHost) {
        Secrets env = Secrets.fromEnvironment();
        Secrets s;
        if (secretFile != null || adminSecretFile != null) {
            if (secretFile == null || adminSecretFile == null) {
                throw new IllegalArgumentException("--secret-file and --admin-secret-file go together: a " + role
                        + " needs both");
            }
            s = Secrets.of(Secrets.readFile(secretFile, "cluster secret"), Secrets.readFile(adminSecretFile, "admin secret"));
        } else {
            s = env;
        }
        if (s.present() && !s.hasAdmin()) {
            throw new IllegalArgumentException("a " + role + " with the cluster secret needs the admin secret too"
                    + " (--admin-secret-file FILE or KVPOOL_ADMIN_SECRET_FILE)");
        }
        if (!s.present() && !insecure && !loopback(listenHost)) {
            throw new IllegalArgumentException(refusal(listenHost, "the " + role + " --secret-file FILE"
                    + " --admin-secret-file FILE (or KVPOOL_SECRET_FILE and KVPOOL_ADMIN_SECRET_FILE"));
        }
        return s.withTls(tls.tls());
    }

    /** Why a pool cannot listen on {@code address} without secrets, and how to give them ({@code how}). */
    static String refusal(String address, String how) {
        return "refusing to listen on " + address + " without a cluster secret: anyone who can reach the port could"
                + " read, overwrite or delete every key. Give " + how + "; make each with: head -c 32 /dev/urandom"
                + " | base64 > FILE; chmod 600 FILE), and give every client, node and master the same files. Or listen"
                + " on 127.0.0.1, or say --insecure.";
    }

    /** Whether an address is only reachable from this machine. */
    static boolean loopback(String host) {
        try {
            return InetAddress.getByName(host).isLoopbackAddress();
        } catch (UnknownHostException e) {
            return false;
        }
    }
}
