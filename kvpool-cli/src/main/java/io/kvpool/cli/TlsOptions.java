package io.kvpool.cli;

import io.kvpool.protocol.Tls;
import picocli.CommandLine.Option;

import java.nio.file.Path;

/**
 * {@code --tls-cert}, {@code --tls-key} and {@code --tls-ca}: mutual TLS for every connection a
 * command opens or serves (docs/security.md). All three or none; none falls back to the environment
 * ({@code KVPOOL_TLS_CERT}, {@code KVPOOL_TLS_KEY}, {@code KVPOOL_TLS_CA}), then to plain TCP. The
 * files are read and checked when the command starts, and a problem names the file.
 */
final class TlsOptions {

    @Option(names = "--tls-cert", paramLabel = "FILE",
            description = "PEM certificate chain this process presents, first its own certificate (a master's or"
                    + " node's lists the addresses others dial it by; default: env " + Tls.CERT_ENV + ").")
    Path cert;

    @Option(names = "--tls-key", paramLabel = "FILE",
            description = "Its private key, unencrypted PKCS#8 PEM (default: env " + Tls.KEY_ENV + ").")
    Path key;

    @Option(names = "--tls-ca", paramLabel = "FILE",
            description = "PEM CA bundle peers' certificates must chain to (default: env " + Tls.CA_ENV + ").")
    Path ca;

    /** The TLS identity the flags, else the environment, name; {@link Tls#NONE} when neither does. */
    Tls tls() {
        if (cert == null && key == null && ca == null) {
            return Tls.fromEnvironment();
        }
        return Tls.of(cert, key, ca, "--tls-cert", "--tls-key", "--tls-ca");
    }
}
