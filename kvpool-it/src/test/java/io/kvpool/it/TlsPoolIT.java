package io.kvpool.it;

import io.kvpool.client.ClientConfig;
import io.kvpool.client.KvPoolClient;
import io.kvpool.client.PoolStats;
import io.kvpool.client.PutStatus;
import io.kvpool.config.HostPort;
import io.kvpool.protocol.BodyWriter;
import io.kvpool.protocol.FrameConnection;
import io.kvpool.protocol.FrameHeader;
import io.kvpool.protocol.Limits;
import io.kvpool.protocol.Opcode;
import io.kvpool.protocol.Secrets;
import io.kvpool.protocol.Tls;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;

import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManagerFactory;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * A master and a node as separate processes, in mutual TLS and holding the secrets, started with the
 * CLI's flags and certificates from scripts/tls-certs.sh. A client with the pool's certificate and
 * secrets puts and gets byte-exact over TCP; a client without a certificate, one whose certificate
 * another CA signed, and a plain-TCP client are refused with errors saying why, counted by the master
 * ({@code master_tls_handshake_failures_total}) and logged by the node, and the pool goes on serving
 * the good client. The class timeout only bounds a hang.
 */
@Timeout(300)
class TlsPoolIT {

    private static final String DATA = "cluster-secret-of-the-tls-pool-it";
    private static final String ADMIN = "admin-secret-of-the-tls-pool-it";
    private static final Duration CALL = Duration.ofSeconds(10);

    @TempDir
    static Path dir;
    private static Path certs;
    private static ProcessCluster cluster;
    private static HostPort node;
    private static KvPoolClient good;

    private static Tls tls(String who, String ca) {
        return Tls.load(certs.resolve(who + ".pem"), certs.resolve(who + ".key"), certs.resolve(ca + ".pem"));
    }

    private static Secrets secrets() {
        return Secrets.of(DATA, ADMIN);
    }

    @BeforeAll
    static void start() throws Exception {
        certs = dir.resolve("certs");
        Path repo = Path.of("").toAbsolutePath().getParent();
        Process p = new ProcessBuilder(repo.resolve("scripts/tls-certs.sh").toString(), certs.toString())
                .redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        assertThat(p.waitFor(60, TimeUnit.SECONDS) && p.exitValue() == 0).as(out).isTrue();
        Path data = Files.writeString(dir.resolve("cluster.secret"), DATA);
        Path admin = Files.writeString(dir.resolve("admin.secret"), ADMIN);
        List<String> flags = List.of("--secret-file", data.toString(), "--admin-secret-file", admin.toString(),
                "--tls-cert", certs.resolve("server.pem").toString(), "--tls-key", certs.resolve("server.key").toString(),
                "--tls-ca", certs.resolve("ca.pem").toString());
        cluster = new ProcessCluster("TlsPoolIT", flags.toArray(new String[0]));
        // anonymous memory: no same-machine path, every byte crosses TCP in TLS
        cluster.startNode("64MiB", "none", 0, flags);
        good = KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress()).withSecrets(secrets())
                .withTls(tls("client", "ca")).withSharedMemory(false));
        PoolStats s = ProcessCluster.awaitActive(good, 1, "the node registered");
        node = new HostPort(s.segments().getFirst().host(), s.segments().getFirst().port());
    }

    @AfterAll
    static void stop() {
        if (good != null) {
            good.close();
        }
        if (cluster != null) {
            cluster.close();
        }
    }

    @Test
    void aClientWithThePoolsCertificateIsServedAndTheOthersAreRefusedAndCounted() throws Exception {
        for (int size : new int[]{100, 4096, 100_000, 3 << 20}) {
            byte[] v = Payloads.make("tls/" + size, size, size);
            assertThat(good.put("tls/" + size, v)).isEqualTo(PutStatus.OK);
            assertThat(good.get("tls/" + size)).hasValueSatisfying(b -> assertThat(b).isEqualTo(v));
        }
        double before = cluster.metric("master_tls_handshake_failures_total");

        // 1. plain TCP, with the right secrets
        assertThatThrownBy(() -> KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                .withSecrets(secrets()).withSharedMemory(false)).close())
                .hasMessageContaining("master requires TLS and this connection is plain TCP");
        assertThatThrownBy(() -> FrameConnection.connect(node, CALL, Limits.DEFAULT, secrets()).close())
                .hasMessageContaining("node requires TLS and this connection is plain TCP");

        // 2. a certificate signed by another CA
        Secrets otherCa = secrets().withTls(tls("other-client", "ca"));
        assertThatThrownBy(() -> KvPoolClient.connect(ClientConfig.forMaster(cluster.masterAddress())
                .withSecrets(otherCa)).close())
                .hasMessageContaining("TLS with " + cluster.masterAddress() + " failed");
        assertThatThrownBy(() -> FrameConnection.connect(node, CALL, Limits.DEFAULT, otherCa).close())
                .hasMessageContaining("TLS with " + node + " failed");

        // 3. no certificate at all (the JDK's own TLS client, trusting the pool's CA)
        assertThat(noCertificateAlert(HostPort.parse(cluster.masterAddress()))).contains("certificate_required");
        assertThat(noCertificateAlert(node)).contains("certificate_required");

        // the master counted its three (the client's connection was refused before it retried, or each retry counted)
        awaitMetricAtLeast("master_tls_handshake_failures_total", before + 3);
        // the node logged its three, with the peer's address
        Path nodeLog = cluster.log("node", 2);
        awaitLog(nodeLog, "refusing a plain-TCP connection from 127.0.0.1:");
        awaitLog(nodeLog, "TLS handshake with 127.0.0.1:");
        assertThat(Files.readString(nodeLog)).contains("certificate_required");

        // and the pool goes on serving the good client, byte-exact
        byte[] after = Payloads.make("tls/after", 7, 1 << 20);
        assertThat(good.put("tls/after", after)).isEqualTo(PutStatus.OK);
        assertThat(good.get("tls/after")).hasValueSatisfying(b -> assertThat(b).isEqualTo(after));
        assertThat(good.get("tls/100000")).hasValueSatisfying(b -> assertThat(b)
                .isEqualTo(Payloads.make("tls/100000", 100_000, 100_000)));
    }

    /** What a TLS client without a certificate gets when it sends a frame: the server's alert. */
    private static String noCertificateAlert(HostPort to) throws Exception {
        KeyStore trust = KeyStore.getInstance("PKCS12");
        trust.load(null, null);
        try (InputStream in = Files.newInputStream(certs.resolve("ca.pem"))) {
            trust.setCertificateEntry("ca", CertificateFactory.getInstance("X.509").generateCertificate(in));
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance("PKIX");
        tmf.init(trust);
        SSLContext ctx = SSLContext.getInstance("TLSv1.3");
        ctx.init(null, tmf.getTrustManagers(), null);
        try (SSLSocket sock = (SSLSocket) ctx.getSocketFactory().createSocket(to.host(), to.port())) {
            sock.setSoTimeout((int) CALL.toMillis());
            ByteBuffer h = FrameHeader.write(FrameHeader.allocate(), Opcode.AUTH_BEGIN.code, false, 0, 1, 0, 0);
            byte[] bytes = new byte[h.remaining()];
            h.get(bytes);
            sock.getOutputStream().write(bytes);
            sock.getOutputStream().flush();
            sock.getInputStream().read();
            throw new AssertionError(to + " answered a client without a certificate");
        } catch (javax.net.ssl.SSLException e) {
            return e.getMessage();
        }
    }

    private static void awaitMetricAtLeast(String name, double n) throws Exception {
        Await.untilChecked(name + " reached " + n, Await.DEFAULT, () -> cluster.metric(name) >= n);
    }

    private static void awaitLog(Path log, String text) throws Exception {
        Await.untilChecked(log + " says '" + text + "'", Await.DEFAULT, () -> Files.readString(log).contains(text));
    }

    @Test
    void aTlsClientOfThisPoolIsRefusedByAPlainPool() throws Exception {
        try (ProcessCluster plain = new ProcessCluster("TlsPoolIT-plain")) {
            assertThatThrownBy(() -> FrameConnection.connect(HostPort.parse(plain.masterAddress()), CALL,
                    Limits.DEFAULT, secrets().withTls(tls("client", "ca"))).close())
                    .hasMessageContaining("answered in plain TCP, not TLS");
            assertThat(plain.metric("master_tls_handshake_failures_total")).isEqualTo(1);
        }
    }
}
